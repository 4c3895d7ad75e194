"""A server with a remote lane (an engine on another machine): when that engine fails, the
integration's problem sensor says so, with each lane's state."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from homeassistant.const import CONF_HOST, CONF_PORT, CONF_TOKEN, STATE_OFF, STATE_ON
from homeassistant.core import HomeAssistant

from .conftest import RunningServer, _free_port, fairlane_entry, running_server
from .test_init import _entity_ids


@pytest.fixture(scope="module")
def _lane_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose background lane is an engine nobody runs (a closed port)."""
    dead = _free_port()
    lane = (f"remotes: [{{name: attic, url: 'http://127.0.0.1:{dead}/v1', "
            "failures_to_open: 1, open_s: 3600}]\n")
    with running_server(tmp_path_factory.mktemp("lane"), lane) as server:
        yield server


def _background_turn(server: RunningServer) -> int:
    body = {"messages": [{"role": "user", "content": "Summarise the day."}],
            "fairlane_class": "background", "max_tokens": 8}
    request = urllib.request.Request(
        f"http://{server.host}:{server.port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


async def test_a_failing_remote_engine_is_a_problem_with_its_lane_named(
    hass: HomeAssistant, _lane_server: RunningServer, socket_enabled: None
) -> None:
    entry = fairlane_entry({CONF_HOST: _lane_server.host, CONF_PORT: _lane_server.port,
                            CONF_TOKEN: _lane_server.token})
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    problem = _entity_ids(hass, entry)["remote_lanes"]
    state = hass.states.get(problem)
    assert state is not None and state.state == STATE_OFF
    assert state.attributes["attic"] == "closed"

    # The engine is down: the turn fails with a clear error and the breaker opens.
    assert await hass.async_add_executor_job(_background_turn, _lane_server) == 502
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()
    state = hass.states.get(problem)
    assert state is not None and state.state == STATE_ON
    assert state.attributes["attic"].startswith("open: ")
    assert "attic" in state.attributes["attic"]  # the server's message names the lane
