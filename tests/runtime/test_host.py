"""The server's thread environment is its own (fairlane.runtime.host), and Wyoming's access
rules."""

from __future__ import annotations

import subprocess
import sys

from fairlane.runtime import host
from fairlane.voice.bounds import beyond_loopback, client_allowed, networks


def test_a_plain_shell_gets_the_servers_thread_settings() -> None:
    env: dict[str, str] = {"PATH": "/usr/bin"}
    host.configure(env)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["GOMP_SPINCOUNT"] == host.SPIN_COUNT


def test_library_pools_are_one_thread_whatever_the_shell_says() -> None:
    env = {"OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "1"}
    assert host.configure(env) == {
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "GOMP_SPINCOUNT": host.SPIN_COUNT}
    assert env["OMP_NUM_THREADS"] == "1"


def test_a_chosen_spin_policy_is_kept() -> None:
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    host.configure(env)
    assert "GOMP_SPINCOUNT" not in env and env["OMP_WAIT_POLICY"] == "PASSIVE"
    env = {"GOMP_SPINCOUNT": "300000"}
    host.configure(env)
    assert env["GOMP_SPINCOUNT"] == "300000"


def test_the_thread_environment_is_set_before_any_native_library_loads() -> None:
    """`fairlane`'s main sets it first thing; nothing imported before it (the command's module
    and its imports) may load numpy (OpenBLAS), llama.cpp, onnxruntime or torch, which read it
    once (review 39cbe61, finding 8: `cli` imported the policy, and numpy with it)."""
    probe = (
        "import sys\n"
        "from fairlane.runtime import host\n"
        "configure = host.configure\n"
        "def checked(*args):\n"
        "    native = ('numpy', 'llama_cpp', 'onnxruntime', 'torch', 'ctranslate2')\n"
        "    print(sorted(n for n in native if n in sys.modules))\n"
        "    return configure(*args)\n"
        "host.configure = checked\n"
        "from fairlane.cli import main\n"
        "main(['simulate', '--help'])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[]"


def test_wyoming_clients_are_those_listed_or_any() -> None:
    listed = networks(("172.30.32.0/23", "192.168.1.20"))
    assert client_allowed(("172.30.33.5", 40000), listed)
    assert client_allowed(("192.168.1.20", 40000), listed)
    assert not client_allowed(("192.168.1.21", 40000), listed)
    assert not client_allowed(("127.0.0.1", 40000), listed)
    assert not client_allowed(None, listed)
    assert client_allowed(("10.1.2.3", 40000), ())  # none listed: any
    assert client_allowed(("::1", 40000, 0, 0), networks(("::1",)))


def test_what_counts_as_beyond_loopback() -> None:
    assert not beyond_loopback("127.0.0.1") and not beyond_loopback("::1")
    assert not beyond_loopback("localhost")
    assert beyond_loopback("0.0.0.0") and beyond_loopback("192.168.1.5")
    assert beyond_loopback("homeassistant.local")
