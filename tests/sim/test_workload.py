from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fairlane.documents.workers import TURN_OVERHEAD_TOKENS, summary_pieces
from fairlane.policy import Kind, Priority
from fairlane.sim import default_workload
from fairlane.sim.workload import WORKLOAD_SCHEMA, Sampler, build, load, summary_jobs


def test_family_workload_has_every_kind_of_household_work() -> None:
    workload = load(default_workload())
    groups = {j.group for j in workload.jobs}
    assert groups == {"voice", "chat", "automation", "document", "summary"}
    voice = [j for j in workload.jobs if j.group == "voice"]
    # A voice command is speech first, then the LLM turn that answers it.
    assert all(j.kind is Kind.STT and j.then is not None and j.then.kind is Kind.LLM
               for j in voice)
    assert workload.slo[Priority.VOICE].stt_ms == 500
    assert {j.client for j in voice} <= {"parent-a", "parent-b", "child"}
    assert load(default_workload()).jobs == workload.jobs  # seeded: the same evening every time


def test_lognormal_matches_its_median_and_p95() -> None:
    sampler = Sampler(1)
    values = sorted(sampler.draw({"lognormal": {"median": 100, "p95": 400}}) for _ in range(20000))
    assert values[10000] == pytest.approx(100, rel=0.05)
    assert values[19000] == pytest.approx(400, rel=0.08)


def test_bad_workload_names_the_problem(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nclients: []\nclasses: {}\n")
    with pytest.raises(ValueError, match="duration_s"):
        load(path)


def test_an_empty_household_has_no_jobs() -> None:
    data = {"name": "empty", "duration_s": 10, "seed": 0, "clients": [], "classes": {},
            "cpu_slo_scale": 1.0}
    assert build(data).jobs == ()


# --- what households have: members, shared prompts, recordings, clients that wait ----------------

SPEECH = Path(__file__).resolve().parents[1] / "fixtures" / "speech"


def _household(**classes: object) -> dict:
    return {"name": "h", "duration_s": 60, "seed": 1, "clients": [], "classes": classes,
            "cpu_slo_scale": 1.0}


def test_a_member_has_their_own_prompt_sizes() -> None:
    chat = {"clients": ["teen", "parent"], "arrivals": {"poisson": {"per_min": 60}},
            "prompt_tokens": 100, "output_tokens": 10, "shared_prefix_tokens": 40,
            "per_client": {"teen": {"prompt_tokens": 2000}}}
    workload = build(WORKLOAD_SCHEMA(_household(chat=chat)))
    sizes = {j.client: j.prompt_tokens for j in workload.jobs}
    assert sizes == {"teen": 2000, "parent": 100}
    assert {j.prefix_tokens for j in workload.jobs} == {40}


def test_spoken_commands_take_their_recordings_lengths(tmp_path) -> None:
    voice = {"clients": ["a"], "arrivals": {"poisson": {"per_min": 30}}, "audio_s": 99,
             "audio_dir": str(SPEECH),
             "llm_turn": {"prompt_tokens": 700, "output_tokens": 20, "shared_prefix_tokens": 600}}
    workload = build(WORKLOAD_SCHEMA(_household(voice=voice)))
    spoken = [j for j in workload.jobs if j.kind is Kind.STT]
    assert spoken and all(j.audio_file and j.audio_file.endswith(".wav") for j in spoken)
    assert all(1.0 < j.audio_s < 5.0 for j in spoken)  # the files' lengths, not 99 s
    assert all(j.then is not None and j.then.prefix_tokens == 600 for j in spoken)
    voice["audio_dir"] = str(tmp_path)
    with pytest.raises(ValueError, match=r"no \.wav"):
        build(WORKLOAD_SCHEMA(_household(voice=voice)))


def test_a_backlog_with_in_flight_and_a_closed_loop_client_become_loops() -> None:
    background = {
        "documents": {"count": 5, "tokens_per_doc": 600, "chunk_tokens": 256, "in_flight": 2},
        "summaries": {"count": 3, "prompt_tokens": 5000, "output_tokens": 50, "in_flight": 1},
    }
    data = _household(background=background)
    data["closed_loop"] = [{"client": "teen", "group": "chat", "in_flight": 1,
                           "prompt_tokens": 300, "output_tokens": 30}]
    workload = build(WORKLOAD_SCHEMA(data))
    assert workload.jobs == ()  # nothing arrives at a fixed time: the clients pace themselves
    loops = {loop.name: loop for loop in workload.loops}
    assert [len(unit) for unit in loops["documents"].units] == [3] * 5  # 256 + 256 + 88
    assert loops["summaries"].in_flight == 1 and len(loops["summaries"].units) == 3
    assert loops["summaries"].units[0][-1].then is not None  # pieces, then their summary
    chat = loops["teen-0"]
    assert chat.until == 60 and chat.units[0][0].priority is Priority.CHAT
    assert workload.cut(30).loops[-1].until == 30


def test_a_summary_is_one_turn_where_it_fits_and_else_the_fewest_pieces_that_fit() -> None:
    # As the server's summariser cuts it: one turn while text, instruction and reply fit the
    # turn's capacity; beyond it the fewest pieces that fit, each with room to spare.
    assert [j.prompt_tokens for j in summary_jobs("s", 5000, 100, capacity=5520)] == [5000]
    pieces = summary_jobs("s", 9000, 100, capacity=5520)
    assert len(pieces) == summary_pieces(9000, 100, 5520) == 2
    assert all(j.prompt_tokens + TURN_OVERHEAD_TOKENS + j.output_tokens <= 5520 for j in pieces)
    reduction = pieces[-1].then
    assert reduction is not None and reduction.prompt_tokens == 2 * pieces[0].output_tokens
    # Where the turn's capacity is not known (a remote lane), pieces of 1,500 tokens.
    assert len(summary_jobs("s", 5000, 100)) == 4


def test_the_simulator_keeps_a_closed_loop_clients_requests_in_flight() -> None:
    from fairlane.sim import scenario, simulate

    scn = scenario(default_workload(), "rtx4090", duration_s=20)
    data = _household(background={
        "documents": {"count": 50, "tokens_per_doc": 1000, "chunk_tokens": 256, "in_flight": 1}})
    data["duration_s"] = 20
    data["closed_loop"] = [{"client": "teen", "group": "chat", "in_flight": 2,
                           "prompt_tokens": 300, "output_tokens": 30}]
    workload = build(WORKLOAD_SCHEMA(data))
    result = simulate(replace(scn, workload=replace(workload, slo=scn.workload.slo)), "fairlane")
    chats = [r for r in result.records if r.group == "chat"]
    documents = [r for r in result.records if r.group == "document"]
    assert len(documents) == 50 * 4  # every document, one at a time, to the end of the backlog
    # Never more than two chat turns outstanding: each starts when an earlier one ends.
    for record in chats:
        outstanding = [r for r in chats if r.arrival <= record.arrival < (r.finished_at or 1e9)]
        assert len(outstanding) <= 2
    assert max(r.arrival for r in chats) < 20 and len(chats) > 10


def test_households_are_separate_homes_on_one_device() -> None:
    """N homes: each its own draw of the evening, its own members, spoken turns and cached
    system prompt (the simulator keys prefixes by home)."""
    from fairlane.config import Config
    from fairlane.sim import homes_served, scenario
    from fairlane.sim.simulator import _shared_prefixes
    from fairlane.sim.workload import households

    one, three = load(default_workload()), households(default_workload(), 3)
    assert households(default_workload(), 1).jobs == one.jobs
    per_home = [[j for j in three.jobs if j.household == h] for h in range(3)]
    assert len(per_home[0]) == len(one.jobs)
    assert per_home[1] != [replace(j, household=1) for j in per_home[0]]  # another draw
    assert {j.client.rpartition("@")[2] for j in per_home[2]} == {"2"}
    turns = [j.turn for j in three.jobs if j.turn >= 0 and j.kind is Kind.STT]
    assert len(turns) == len(set(turns))  # a spoken turn is one home's
    assert len(_shared_prefixes(three)) == 3 * len(_shared_prefixes(one))
    assert [j.at for j in three.jobs] == sorted(j.at for j in three.jobs)

    budgets = Config().serving_policy("gpu")
    scn = scenario(default_workload(), "h200", budgets, duration_s=60, homes=2)
    assert scn.workload.name.endswith("x2") and len(scn.workload.loops) == 2 * len(one.loops)
    served, tried = homes_served(default_workload(), "h200", budgets, most=2, duration_s=60)
    assert [t.homes for t in tried][:1] == [1] and 0 <= served <= 2
    assert all(0.0 <= t.worst_attainment <= 1.0 for t in tried)


# --- workloads say what they mean (issue 45) ---------------------------------------------------


@pytest.mark.parametrize(
    ("where", "key"),
    [((), "durations_s"), (("classes", "chat"), "per_minute"),
     (("classes", "chat", "per_client", "teen"), "prompt_token"),
     (("classes", "background", "summaries"), "inflight")],
)
def test_a_misspelt_key_is_refused_not_ignored(tmp_path, where: tuple[str, ...], key: str) -> None:
    """A workload with a key Fairlane does not read is an error naming it: before, any key was
    accepted silently, and a misspelt one meant a different evening than the one written."""
    data = _household(
        chat={"clients": ["teen"], "arrivals": {"poisson": {"per_min": 6}}, "prompt_tokens": 100,
              "output_tokens": 10, "per_client": {"teen": {"prompt_tokens": 300}}},
        background={"summaries": {"count": 1, "prompt_tokens": 500, "output_tokens": 20}},
    )
    node = data
    for part in where:
        node = node[part]
    node[key] = 1
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=f"extra keys not allowed.*{key}"):
        load(path)


def test_a_member_may_have_their_own_arrivals_or_keep_requests_in_flight() -> None:
    """`per_client` sets a member's own arrivals (a rate, or `in_flight`: a closed loop), which
    was parsed and ignored: everyone shared the class's arrivals."""
    chat = {"clients": ["parent-a", "parent-b", "teen"], "arrivals": {"poisson": {"per_min": 6}},
            "prompt_tokens": 100, "output_tokens": 10, "shared_prefix_tokens": 40,
            "per_client": {"parent-a": {"arrivals": {"poisson": {"per_min": 30}}},
                           "teen": {"in_flight": 4, "prompt_tokens": 1500}}}
    workload = build(WORKLOAD_SCHEMA(_household(chat=chat)))
    by_member = {c: [j for j in workload.jobs if j.client == c] for c in chat["clients"]}
    assert 20 <= len(by_member["parent-a"]) <= 45  # ~30 a minute of their own, over 60 s
    assert 1 <= len(by_member["parent-b"]) <= 15  # the class's 6 a minute, theirs alone now
    assert by_member["teen"] == []  # no fixed arrivals: a loop
    (loop,) = workload.loops
    assert loop.in_flight == 4 and loop.until == 60
    first = loop.units[0][0]
    assert (first.client, first.priority, first.prompt_tokens, first.prefix_tokens) == (
        "teen", Priority.CHAT, 1500, 40)
    assert [j.at for j in workload.jobs] == sorted(j.at for j in workload.jobs)
    both = {**chat, "per_client": {"teen": {"in_flight": 2, "arrivals": chat["arrivals"]}}}
    with pytest.raises(Exception, match="not both"):
        WORKLOAD_SCHEMA(_household(chat=both))


def test_the_fairness_case_runs_in_the_simulator_member_by_member() -> None:
    """The shipped fairness case (one member's long prompts four at a time beside two who chat)
    reports each member beside the others against the same member alone."""
    from fairlane.sim import scenario, simulate
    from fairlane.sim.clients import alone, members, per_member

    path = Path(default_workload()).parent / "fairness-cpu.yaml"
    scn = scenario(path, "cpu-2core", duration_s=60)
    assert members(scn.workload) == ["parent-a", "parent-b", "teen"]
    teen = alone(scn.workload, "teen")
    assert teen.jobs == () and [loop.in_flight for loop in teen.loops] == [4]
    report = per_member(scn, "fairlane", simulate(scn, "fairlane"), noise=0.0, seed=0)
    rows = report["members"]
    assert set(rows) == {"parent-a", "parent-b", "teen"}
    for row in rows.values():
        # Beside the others no one gets more than alone, and everyone gets something.
        assert 0 < row["service_kept"] <= 1.05
        assert row["ttft_p50_ms"] >= row["alone_ttft_p50_ms"] * 0.95
    assert 1 / 3 <= report["jain_within_class"]["chat"] <= 1.0
