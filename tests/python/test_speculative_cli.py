"""`dsv41rt generate --speculative-config` (issue 24): DSpark-drafted greedy generation gives the
tokens of plain `generate`, bitwise (EOS handling included), and bad configs are refused with an
error naming what is wrong."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dsv41rt.cli import main
from dsv41rt.errors import Dsv41rtError
from dsv41rt.speculative import SpeculativeConfig, parse_speculative_config


def test_generate_with_speculation_equals_plain_generate(tmp_path, tiny_v41_dir: str, capsys) -> None:
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 129000, n)] for n in (1, 9, 40, 130)]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prompts))
    args = ["generate", "--checkpoint", tiny_v41_dir, "--prompts", str(path), "--max-new-tokens", "12"]
    assert main([*args, "--out", str(tmp_path / "plain.json")]) == 0
    for k, name in (("", "block"), (', "num_speculative_tokens": 3', "k3"), (', "num_speculative_tokens": 0', "k0")):
        config = '{"method": "dspark"' + k + "}"
        assert main([*args, "--speculative-config", config, "--out", str(tmp_path / f"{name}.json")]) == 0
        assert "draft tokens accepted" in capsys.readouterr().out
        plain, spec = (json.loads((tmp_path / f"{x}.json").read_text()) for x in ("plain", name))
        assert spec == plain, name


def test_speculative_generation_stops_at_eos_like_the_engine(tiny_v41_dir: str) -> None:
    """With the first greedy token declared a stop token, both paths end right after it."""
    from dsv41rt.runtime import Runtime
    from dsv41rt.speculative import generate_greedy_speculative

    rt = Runtime(tiny_v41_dir, load_drafter=True)
    try:
        prompt = [5, 17, 230, 9]
        free = generate_greedy_speculative(rt, prompt, 10)
        stop = free.tokens[3]
        cut = generate_greedy_speculative(rt, prompt, 10, stop_token_ids=[stop])
        assert list(cut.tokens) == list(free.tokens[: free.tokens.index(stop) + 1])
        engine = rt.generate([prompt], max_new_tokens=10, ignore_eos=True)
        assert engine[0] == list(free.tokens)
        h = rt.add_request(prompt, 10, stop_token_ids=[stop])
        got: list[int] = []
        while rt.has_unfinished():
            for o in rt.step():
                if o.request_id == h:
                    got += o.new_tokens
        assert got == list(cut.tokens)
    finally:
        rt.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"method": "ngram"}', '"method" must be "dspark"'),
        ("{}", '"method" must be "dspark"'),
        ('{"method": "dspark", "num_speculative_tokens": -1}', "integer >= 0"),
        ('{"method": "dspark", "num_speculative_tokens": 2.5}', "integer >= 0"),
        ('{"method": "dspark", "draft_model": "x"}', "unknown key"),
    ],
)
def test_bad_speculative_configs_are_named(text: str, message: str) -> None:
    with pytest.raises(Dsv41rtError, match=message):
        parse_speculative_config(text)


def test_speculative_config_values() -> None:
    assert parse_speculative_config('{"method": "dspark"}') == SpeculativeConfig("dspark", None)
    assert parse_speculative_config({"method": "dspark", "num_speculative_tokens": 5}) == SpeculativeConfig("dspark", 5)


def test_cli_refuses_a_bad_config_and_a_too_long_draft(tmp_path, tiny_v41_dir: str, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps([[3, 4, 5]]))
    args = ["generate", "--checkpoint", tiny_v41_dir, "--prompts", str(path), "--max-new-tokens", "4"]
    out = str(tmp_path / "o.json")
    assert main([*args, "--speculative-config", '{"method": "eagle"}', "--out", out]) == 2
    assert '"method" must be "dspark"' in capsys.readouterr().err
    assert (
        main([*args, "--speculative-config", '{"method": "dspark", "num_speculative_tokens": 99}', "--out", out]) == 2
    )
    assert "num_speculative_tokens must be in" in capsys.readouterr().err
