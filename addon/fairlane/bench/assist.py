"""`fairlane bench assist`: Home Assistant's public assistant benchmark through Fairlane.

Runs allenporter's home-assistant-datasets (`assist-mini`, `assist`) through real Home
Assistant with the `synthetic_home` custom component, for these agents:
- `fairlane`: Fairlane's conversation agent (the real integration and server, Assist's tools);
- `fairlane+local`: what a pipeline with "prefer handling commands locally" does: Home
  Assistant's own sentence matching first, Fairlane for the rest;
- `homeassistant`: Home Assistant's own agent, no LLM.

The harness and its data are used from where they are published, never copied here: the
`home-assistant-datasets` and `synthetic-home` packages from PyPI (installed into
`.bench/assist-venv`, beside the integration tests' Home Assistant in `.venv-ha`), the dataset
files and the `synthetic_home` custom component from their repositories (`--datasets` and
`--synthetic-home` are the paths of those checkouts). What Fairlane adds is a pytest plugin
(`assist_harness/fairlane_assist.py`: the per-turn limit, the local-first agent, the turn
times) and the models' entries. Each repeat runs every agent in turn (A B C A B C); the
harness's own `eval` scores the outputs, and a task counts as passed when none of its checks
failed. Accuracy per category with n, seconds per turn (median, p95), the leaderboard's
published figures beside.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml

from fairlane.bench.servers import ServerProcess, free_port

AGENTS = ("fairlane", "fairlane+local", "homeassistant")
HARNESS = ("home-assistant-datasets==0.3.0", "synthetic-home==5.0.3", "pyrate-limiter==3.9.0")
PLUGIN = Path(__file__).resolve().parent / "assist_harness" / "fairlane_assist.py"
INTEGRATION = Path(__file__).resolve().parents[3] / "custom_components" / "fairlane"
# The Home LLM Leaderboard's figures (allenporter/home-assistant-datasets, reports/, Ollama,
# Q4 quantisations), for the dataset each was published on.
PUBLISHED = {
    "assist-mini": {"qwen3-1.7b": 0.602, "qwen3-4b-instruct": 0.867, "qwen3.5-4b": 0.883,
                    "gemma4-e4b": 0.913},
}


def assist(
    datasets: Path,
    synthetic_home: Path,
    dataset: str = "assist-mini",
    agents: tuple[str, ...] = AGENTS,
    count: int = 1,
    categories: str | None = None,
    turn_timeout_s: float = 300.0,
    work: Path = Path(".bench/assist"),
    serve_args: tuple[str, ...] = (),
    checkout: Path | None = None,
) -> dict[str, Any]:
    """Run the agents `count` times over the dataset; the figures per agent. `checkout`: run
    another checkout's integration and server (an earlier commit, for a before-and-after)."""
    unknown = set(agents) - set(AGENTS)
    if unknown:
        raise ValueError(f"unknown agents {sorted(unknown)}; expected some of {AGENTS}")
    dataset_dir = datasets / "datasets" / dataset
    if not (dataset_dir / "dataset_card.yaml").exists():
        raise ValueError(f"{dataset_dir} holds no dataset_card.yaml (give --datasets a checkout "
                         "of allenporter/home-assistant-datasets)")
    component = synthetic_home / "custom_components" / "synthetic_home"
    if not (component / "manifest.json").exists():
        raise ValueError(f"{component} is not the synthetic_home custom component (give "
                         "--synthetic-home a checkout of home-assistant-synthetic-home)")
    python = harness_python(work)
    integration = (checkout or INTEGRATION.parents[1]).resolve() / "custom_components" / "fairlane"
    run_dir = _run_dir(work, component, integration)
    token = secrets.token_hex(16)
    port = free_port()
    _write_models(run_dir, port, token)
    server = None
    if any(a.startswith("fairlane") for a in agents):
        server = ServerProcess(
            [sys.executable, "-m", "fairlane", "serve", "--port", str(port), "--token", token,
             "--set", f"server.data_dir={work / 'server-data'}", "--set", "stt.enabled=false",
             "--set", "tts.enabled=false", "--set", "wyoming.enabled=false", *serve_args],
            port, timeout_s=600,
            env={**os.environ, "PYTHONPATH": str(checkout.resolve() / "addon")} if checkout
            else None,
        )
    outputs: dict[str, list[Path]] = {agent: [] for agent in agents}
    try:
        for repeat in range(count):
            for agent in agents:  # A B C, A B C
                out = work / "out" / f"{agent}-{repeat}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                _collect(python, run_dir, agent, dataset_dir, out, categories, turn_timeout_s)
                outputs[agent].append(out)
    finally:
        if server is not None:
            server.close()
    results = {agent: _score(python, run_dir, runs) for agent, runs in outputs.items()}
    return {"dataset": dataset, "count": count, "agents": results,
            "published": PUBLISHED.get(dataset, {}),
            "checkout": str(checkout) if checkout else None}


def harness_python(work: Path) -> Path:
    """The harness's Python: Home Assistant from `.venv-ha` (Python 3.13) with the harness's
    packages beside it in a venv of its own."""
    venv_ha = Path(".venv-ha")
    if not (venv_ha / ".installed").exists():
        raise ValueError("no .venv-ha: run `make .venv-ha/.installed` (or `make test`) first")
    venv = work.parent / "assist-venv"
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        base = venv_ha.resolve() / "bin" / "python"
        subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        ha_site = next((venv_ha.resolve() / "lib").glob("python3*/site-packages"))
        (site / "fairlane-ha.pth").write_text(f"{ha_site}\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                        "--target", str(site), *HARNESS], check=True)
        (venv / ".installed").touch()
    return python


def _run_dir(work: Path, component: Path, integration: Path) -> Path:
    """The harness's working directory: its custom components (synthetic_home and Fairlane's
    integration, linked), the models' entries, and Fairlane's plugin."""
    run_dir = work / "run"
    components = run_dir / "custom_components"
    components.mkdir(parents=True, exist_ok=True)
    (components / "__init__.py").touch()
    for name, target in (("synthetic_home", component.resolve()), ("fairlane", integration)):
        link = components / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    shutil.copy(PLUGIN, run_dir / "fairlane_assist.py")
    (run_dir / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    return run_dir


def _write_models(run_dir: Path, port: int, token: str) -> None:
    """The entries the harness makes for each agent. Its model YAML takes the config entry's
    data and subentries; it talks to `conversation.mock_title`, so the agent's title is that."""
    models = run_dir / "models"
    models.mkdir(exist_ok=True)
    agent = {"subentry_type": "conversation", "title": "Mock Title", "unique_id": None,
             "data": {"llm_hass_api": ["assist"], "chat_class": "auto"}}
    entry = {"domain": "fairlane", "version": 2, "minor_version": 1,
             "config_entry_data": {"host": "127.0.0.1", "port": port, "token": token},
             "subentries_data": [agent]}
    for model_id in ("fairlane", "fairlane+local"):
        description = "Fairlane's agent" + (", Home Assistant's matching first" if "+" in
                                            model_id else "")
        (models / f"{model_id}.yaml").write_text(yaml.safe_dump(
            {"model_id": model_id, "description": description, **entry}))
    (models / "homeassistant.yaml").write_text(yaml.safe_dump(
        {"model_id": "homeassistant", "domain": "homeassistant",
         "description": "Home Assistant's own agent"}))


def _collect(python: Path, run_dir: Path, agent: str, dataset: Path, out: Path,
             categories: str | None, turn_timeout_s: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(run_dir.resolve()),
           "FAIRLANE_ASSIST_TIMEOUT": str(turn_timeout_s),
           "FAIRLANE_ASSIST_TIMES": str((out / "times.jsonl").resolve()),
           "FAIRLANE_ASSIST_LOCAL_FIRST": "1" if agent.endswith("+local") else "0"}
    argv = [str(python.absolute()), "-m", "pytest", "-q", "-p", "fairlane_assist",
            str(_harness_dir(python, "collect")), f"--models={agent}",
            f"--dataset={dataset.resolve()}", f"--model_output_dir={(out / 'outputs').resolve()}",
            "--count=1", "-p", "no:cacheprovider", "--asyncio-mode=auto"]
    if categories:
        argv.append(f"--categories={categories}")
    done = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True)
    (out / "collect.log").write_text(done.stdout + done.stderr)
    if not _model_outputs(out / "outputs"):
        raise RuntimeError(f"{agent}: the harness wrote no outputs; see {out / 'collect.log'}:\n"
                           + (done.stdout + done.stderr)[-3000:])


def _harness_dir(python: Path, step: str) -> Path:
    """The harness's `collect` or `eval` tests, where its package is installed."""
    found = subprocess.run(
        [str(python.absolute()), "-c",
         "import home_assistant_datasets.tool.assist as a; print(a.__path__[0])"],
        capture_output=True, text=True, check=True,
    )
    return Path(found.stdout.strip()) / step


def _score(python: Path, run_dir: Path, runs: list[Path]) -> dict[str, Any]:
    """The harness's eval over each run: tasks passed overall and per category, turn times."""
    passed_by: dict[str, list[int]] = {}
    times: list[float] = []
    odd: list[str] = []  # replies with JSON, "null" or another script than the home's (Latin)
    for out in runs:
        junit = out / "eval.xml"
        subprocess.run(
            [str(python.absolute()), "-m", "pytest", "-q", str(_harness_dir(python, "eval")),
             f"--model_output_dir={(out / 'outputs').resolve()}", f"--junitxml={junit.resolve()}",
             "-p", "no:cacheprovider", "--asyncio-mode=auto"],
            cwd=run_dir, capture_output=True, text=True,
        )
        failed = _failed_outputs(junit)
        for path, output in _model_outputs(out / "outputs"):
            key = str(path.relative_to(out / "outputs"))
            category = str(output.get("category") or "other")
            passed_by.setdefault(category, []).append(0 if key in failed else 1)
            if _odd(str(output.get("response") or "")):
                odd.append(str(output.get("response"))[:160])
        if (out / "times.jsonl").exists():
            times += [json.loads(line)["seconds"]
                      for line in (out / "times.jsonl").read_text().splitlines()]
    every = [p for passed in passed_by.values() for p in passed]
    return {
        "passed": sum(every), "n": len(every),
        "accuracy": sum(every) / len(every) if every else 0.0,
        "categories": {c: {"passed": sum(p), "n": len(p)} for c, p in sorted(passed_by.items())},
        "turn_s": {"median": statistics.median(times) if times else None,
                   "p95": _p95(times)},
        "odd_replies": len(odd), "odd_examples": odd[:8],
        "runs": [str(out) for out in runs],
    }


ODD = re.compile(r"[{}\[\]`]|\bnull\b", re.IGNORECASE)


def _odd(reply: str) -> bool:
    """A reply that holds JSON or "null", or letters of a script other than Latin (the
    datasets' homes speak English)."""
    return bool(ODD.search(reply)) or any(
        c.isalpha() and not unicodedata.name(c, "").startswith("LATIN") for c in reply
    )


def _model_outputs(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The harness's model output files (one a task and turn), beside its reports."""
    found = []
    for path in sorted(folder.rglob("*.yaml")):
        if path.name.startswith(("_", "reports")):
            continue
        output = yaml.safe_load(path.read_text())
        if isinstance(output, dict) and "task_id" in output:
            found.append((path, output))
    return found


def _failed_outputs(junit: Path) -> set[str]:
    """The model output files (as the eval names them) with a failed or errored check."""
    if not junit.exists():
        raise RuntimeError(f"the harness's eval wrote no {junit}")
    failed = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            name = case.get("name", "")
            failed.add(name[name.index("[") + 1 : -1] if "[" in name else name)
    return failed


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def format_table(result: dict[str, Any]) -> str:
    """The agents' accuracy overall and per category, turn times, and the published figures."""
    agents = result["agents"]
    categories = sorted({c for r in agents.values() for c in r["categories"]})
    lines = [
        "| agent | " + result["dataset"] + " | " + " | ".join(categories)
        + " | turn s, median | p95 | replies with JSON, null or another script |",
        "|---" * (len(categories) + 5) + "|",
    ]
    for agent, r in agents.items():
        cells = [f"{r['categories'][c]['passed']}/{r['categories'][c]['n']}"
                 if c in r["categories"] else "" for c in categories]
        median, p95 = r["turn_s"]["median"], r["turn_s"]["p95"]
        lines.append(
            f"| {agent} | **{r['passed']}/{r['n']} = {r['accuracy']:.1%}** | "
            + " | ".join(cells)
            + (f" | {median:.1f} | {p95:.1f}" if median is not None else " | |")
            + f" | {r['odd_replies']} |"
        )
    for model, accuracy in result["published"].items():
        lines.append(f"| published (leaderboard, Ollama, Q4): {model} | {accuracy:.1%} |"
                     + " |" * (len(categories) + 3))
    return "\n".join(lines)
