"""The C API from a C++ host: examples/cpp_host built with CMake against the installed Python
package (`find_package(dsv41rt)` from the package directory), run on tiny checkpoints (V4.1, and
DeepSeek-V4 at the width its quantised cache rows hold: the same C API, unchanged); its tokens must
equal what the Python `Runtime` produces for the same prompts and sampling seeds."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PROMPTS = [[0, 671, 6102, 13462], [0, 5, 6, 7, 8, 9, 10], [0, 1000], [0] + list(range(42, 60)), [0, 3, 3, 3]]


@pytest.fixture(scope="module")
def cpp_host(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example host, built once for the module."""
    import dsv41rt

    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    package = os.path.dirname(dsv41rt.__file__)
    assert os.path.exists(os.path.join(package, "cmake", "dsv41rtConfig.cmake")), "the wheel lacks the CMake package"
    build = tmp_path_factory.mktemp("cpp_host") / "build"
    cfg = subprocess.run(
        ["cmake", "-S", os.path.join(ROOT, "examples", "cpp_host"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={package}"],
        capture_output=True,
        text=True,
    )
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    made = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    return str(build / "cpp_host")


@pytest.mark.parametrize("checkpoint", ["tiny_v41_dir", "tiny_v4_d512_dir"])
def test_cpp_host_matches_python_runtime(tmp_path, cpp_host: str, checkpoint: str, request) -> None:
    from dsv41rt.runtime import Runtime
    from dsv41rt.sampling import SamplingParams

    path = request.getfixturevalue(checkpoint)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(" ".join(map(str, p)) for p in PROMPTS) + "\n")
    run = subprocess.run([cpp_host, path, str(prompts)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    got = {}
    for line in run.stdout.splitlines():
        if line.startswith("result "):
            head, ids = line.split(":", 1)
            got[int(head.split()[1])] = [int(t) for t in ids.split()]
    assert "stream 0:" in run.stdout and f"stats: {len(PROMPTS)} finished" in run.stdout
    rt = Runtime(path)
    for i, p in enumerate(PROMPTS):
        want = rt.generate([p], 12, SamplingParams(temperature=0.8, top_p=0.9, seed=i), ignore_eos=True)[0]
        assert got[i] == want, f"prompt {i}: C++ host {got[i]} vs Python {want}"
