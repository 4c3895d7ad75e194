from __future__ import annotations

import pytest

from fairlane import config
from fairlane.policy import Priority


def test_defaults_need_no_file() -> None:
    cfg = config.load(None)
    assert cfg.server.port == 8844 and cfg.server.host == "127.0.0.1"
    assert cfg.policy_name == "fairlane" and cfg.policy.slice_ms == 50


def test_per_class_values_merge_onto_defaults(tmp_path) -> None:
    path = tmp_path / "fairlane.yaml"
    path.write_text("policy:\n  slo:\n    chat: {itl_ms: 150}\n  queue_limit: {voice: 4}\n")
    cfg = config.load(path)
    assert cfg.policy.slo[Priority.CHAT].itl_ms == 150
    assert cfg.policy.slo[Priority.CHAT].ttft_ms == 1000
    assert cfg.policy.queue_limit[Priority.VOICE] == 4
    assert cfg.policy.queue_limit[Priority.CHAT] == 128


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("policy: {slice_ms: 0}", "policy.slice_ms"),
        ("policy: {slicems: 10}", "policy.slicems: extra keys not allowed"),
        ("policy: {queue_limit: {family: 3}}", "policy.queue_limit"),
        ("server: {port: 99999}", "server.port"),
        ("- just a list", "must be a mapping"),
        ("policy: {slice_ms: [", "not valid YAML"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=message.replace("[", r"\[")):
        config.load(path)


def test_missing_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read config"):
        config.load(tmp_path / "nope.yaml")


def test_overrides_set_single_keys_over_the_file(tmp_path) -> None:
    path = tmp_path / "fairlane.yaml"
    path.write_text("llm: {threads: 2, n_ctx: 4096}\n")
    cfg = config.load(path, ["llm.threads=6", "policy.slo.voice.ttft_ms=300", "stt.vad=true",
                             "embed.enabled=false", "server.token="])
    assert cfg.llm.threads == 6 and cfg.llm.n_ctx == 4096  # the file's other keys stay
    assert cfg.policy.slo[Priority.VOICE].ttft_ms == 300
    assert cfg.stt.vad is True and cfg.embed.enabled is False
    assert cfg.server.token is None  # an empty value keeps the default


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("llm.threads", "SECTION.KEY=VALUE"),
        ("threads=4", "SECTION.KEY=VALUE"),
        ("llm.treads=4", "llm.treads: extra keys not allowed"),
        ("llm.threads=many", "llm.threads"),
        ("llm.threads.x=1", "llm.threads"),
    ],
)
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.load(None, [override])


def test_token_file_is_made_once_and_kept(tmp_path) -> None:
    path = tmp_path / "data" / "token"
    first = config.token_from_file(path)
    assert len(first) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert config.token_from_file(path) == first  # a restart keeps it


def test_remotes_with_the_same_work_are_one_lane_and_partial_overlaps_are_refused() -> None:
    """Two GPU boxes for the same classes are one lane (issue 46); a remote that shares only
    some of another's work would make a request's lane ambiguous, and is refused."""
    from fairlane.runtime.remote import lanes_of

    box = {"url": "http://gpu:8000/v1", "classes": ["chat", "background"]}
    cfg = config.parse({"remotes": [{"name": "a", "engine": "vllm", **box},
                                    {"name": "b", "engine": "sglang", **box},
                                    {"name": "c", "url": "http://e:1/v1", "kinds": ["embed"]}]})
    assert [[r.name for r in lane] for lane in lanes_of(cfg.remotes)] == [["a", "b"], ["c"]]
    assert [r.engine for r in cfg.remotes] == ["vllm", "sglang", "openai"]
    with pytest.raises(config.ConfigError, match="share some work but not all"):
        config.parse({"remotes": [{"name": "a", **box},
                                  {"name": "b", "url": "http://x:1/v1", "classes": ["chat"]}]})
    with pytest.raises(config.ConfigError, match="two remotes are named 'a'"):
        config.parse({"remotes": [{"name": "a", **box}, {"name": "a", **box}]})
    with pytest.raises(config.ConfigError, match="engine"):
        config.parse({"remotes": [{"name": "a", "engine": "tgi", **box}]})
