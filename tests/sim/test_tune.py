"""`fairlane tune`: the simulator's search for the most background work within the SLOs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fairlane import config
from fairlane.bench.tune import Trial, _line, _speech_line, config_file, recommend, search
from fairlane.cli import main
from fairlane.sim import default_workload, scenario

SPEECH = Path(__file__).resolve().parents[1] / "fixtures" / "speech"


def test_a_straight_line_through_the_measurements() -> None:
    assert _line([(1, 25), (2, 35), (4, 55), (8, 95)]) == pytest.approx((15.0, 10.0))


def test_speech_that_batches_worse_than_one_by_one_is_priced_at_one_utterance() -> None:
    """Whisper on this 2-core CPU: 1, 2 and 4 utterances in 705, 1,634 and 2,925 ms, each
    batch dearer than its utterances one by one. The least-squares line priced one utterance
    at 786 ms (the calibration of session 28: 828) against 705 measured."""
    assert _speech_line([(1, 705), (2, 1634), (4, 2925)]) == pytest.approx((0.0, 705.0))
    assert _speech_line([(1, 705), (2, 1734), (4, 3325)]) == pytest.approx((0.0, 705.0))
    # Where batching pays (a GPU: a fixed cost shared), the line as it is.
    assert _speech_line([(1, 20), (2, 32), (4, 56)]) == pytest.approx((8.0, 12.0))


def test_settings_within_the_slos_beat_any_that_miss_them() -> None:
    fast_but_late = Trial({"slice_ms": 200}, {"voice/llm": 0.9}, 500.0, 0)
    on_time = Trial({"slice_ms": 50}, {"voice/llm": 1.0}, 300.0, 0)
    closer = Trial({"slice_ms": 100}, {"voice/llm": 0.93}, 100.0, 0)
    ranked = sorted([fast_but_late, on_time, closer], key=lambda t: t.score(0.95), reverse=True)
    assert ranked == [on_time, closer, fast_but_late]


def test_a_gain_the_simulator_cannot_tell_apart_keeps_the_defaults() -> None:
    defaults = Trial({"slice_ms": 50}, {"chat/llm": 1.0}, 53.1, 2414)
    slightly = Trial({"arrival_wait_fraction": 0.4}, {"chat/llm": 1.0}, 53.4, 2244)
    clearly = Trial({"slice_ms": 100}, {"chat/llm": 1.0}, 60.0, 2300)
    kept, why = recommend([slightly, defaults], defaults, 0.95)
    assert kept is defaults and "within the 5%" in why
    chosen, _ = recommend([clearly, slightly, defaults], defaults, 0.95)
    assert chosen is clearly
    # Defaults that miss the SLOs are no reference: the best is recommended, however close.
    late = Trial({"slice_ms": 50}, {"chat/llm": 0.5}, 53.1, 2414)
    assert recommend([slightly, late], late, 0.95)[0] is slightly


def test_search_starts_from_the_servers_settings_and_never_ends_worse() -> None:
    scn = scenario(default_workload(), "rtx4090", duration_s=60)
    space = {"slice_ms": (25, 50, 200), "max_batch_tokens": (512, 2048)}
    trials = search(scn, 0.95, passes=1, space=space, progress=lambda line: None)
    start = next(t for t in trials if t.settings == {"slice_ms": 50.0, "max_batch_tokens": 2048.0})
    best = trials[0]
    assert best.score(0.95) >= start.score(0.95)
    assert len(trials) == 4  # the start, and each other value once (the start is not re-run)


def test_the_written_configuration_is_one_the_server_reads(tmp_path) -> None:
    text = config_file({"slice_ms": 100.0, "max_num_seqs": 4.0}, "tuned")
    path = tmp_path / "tuned.yaml"
    path.write_text(text)
    cfg = config.load(str(path))
    assert cfg.policy.slice_ms == 100.0 and cfg.policy.max_num_seqs == 4


def test_tune_command_writes_a_config_and_every_trial(tmp_path, capsys) -> None:
    out, report = tmp_path / "tuned.yaml", tmp_path / "trials.json"
    code = main(["tune", "--profile", "rtx4090", "--duration", "30", "--passes", "1",
                 "--out", str(out), "--json", str(report)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Recommended:" in printed and "defaults:" in printed
    assert set(yaml.safe_load(out.read_text())["policy"]) >= {"slice_ms", "max_batch_tokens"}
    assert config.load(str(out))  # the server accepts it


@pytest.mark.model
def test_calibrate_fits_a_profile_from_this_machines_engines(tmp_path, monkeypatch) -> None:
    """`--calibrate` times the real engines (a small sweep here) and fits a profile the way
    `fairlane profile fit` fits the shipped ones: every LLM term, its fit error in the header,
    the sweep kept beside it, embedding and speech terms timed, and the simulator reads it."""
    from fairlane.bench import tune
    from fairlane.profiles import load

    monkeypatch.setattr(tune, "SWEEP", {
        "prefill_sizes": (16, 64), "decode_sizes": (1, 2), "context_sizes": (256,),
        "occupancy": ((1, 128),), "prefill_after": ((16, 64),)})
    out = tmp_path / "tuned.profile.yaml"
    text = tune.calibrate(1, SPEECH, out)
    out.write_text(text)
    assert "relative error median" in text and "timed on this machine" in text
    assert (tmp_path / "tuned.profile.engine.json").exists()  # the data it came from
    profile, device = load(str(out))
    assert device == "cpu"
    assert profile.llm.prefill_token_ms > 0 and profile.llm.decode_seq_ms >= 0
    assert profile.embed.token_ms > 0 and profile.stt.utterance_ms + profile.stt.base_ms > 0
    # A real server's round trip, less its step, is the simulator's host term.
    assert profile.host.round_trip_ms > 0 and "Host round trip: measured" in text
    engine = yaml.safe_load((tmp_path / "tuned.profile.engine.json").read_text())
    assert list(engine["prefill_after_ms_per_token"]) == ["16@64"]  # a later chunk, timed
    data = yaml.safe_load(text)
    assert data["fit_error"]["llm"]["points"] >= 6
    scenario(default_workload(), str(out), duration_s=10)  # the simulator and tune take it
