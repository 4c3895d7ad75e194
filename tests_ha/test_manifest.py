"""The rules hassfest and HACS apply to a custom integration, checked on our files."""

from __future__ import annotations

import ast
import json
import struct
from pathlib import Path

import yaml
from awesomeversion import AwesomeVersion
from homeassistant.const import Platform

from custom_components.fairlane import PLATFORMS
from custom_components.fairlane.sensor import SENSORS

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION = ROOT / "custom_components" / "fairlane"
MANIFEST = json.loads((INTEGRATION / "manifest.json").read_text())
STRINGS = json.loads((INTEGRATION / "strings.json").read_text())

IOT_CLASSES = {
    "assumed_state", "cloud_polling", "cloud_push", "local_polling", "local_push", "calculated",
}
INTEGRATION_TYPES = {"device", "entity", "hardware", "helper", "hub", "service", "system",
                     "virtual"}


def test_manifest_follows_hassfest() -> None:
    keys = list(MANIFEST)
    # hassfest: domain, name, then the other keys in alphabetical order.
    assert keys[:2] == ["domain", "name"] and keys[2:] == sorted(keys[2:])
    assert MANIFEST["domain"] == INTEGRATION.name
    # Custom integrations must carry a version; these are required by hassfest for all.
    for key in ("version", "codeowners", "documentation", "iot_class", "config_flow",
                "integration_type", "issue_tracker", "requirements"):
        assert key in MANIFEST, key
    assert AwesomeVersion(MANIFEST["version"]).valid
    assert MANIFEST["iot_class"] in IOT_CLASSES
    assert MANIFEST["integration_type"] in INTEGRATION_TYPES
    assert MANIFEST["config_flow"] is True
    assert all(owner.startswith("@") for owner in MANIFEST["codeowners"])
    assert MANIFEST["documentation"].startswith("https://")
    assert MANIFEST["issue_tracker"].startswith("https://")
    assert "conversation" in MANIFEST["dependencies"]
    assert {"assist_pipeline", "intent"} <= set(MANIFEST["after_dependencies"])
    assert MANIFEST["requirements"] == []  # only what Home Assistant ships (aiohttp)


def test_hacs_json_and_brand() -> None:
    hacs = json.loads((ROOT / "hacs.json").read_text())
    assert hacs["name"] == MANIFEST["name"]
    # The icon is served from brand/ by Home Assistant 2026.3 and later: the minimum.
    assert AwesomeVersion(hacs["homeassistant"]) >= AwesomeVersion("2026.3.0")
    assert not hacs.get("content_in_root")  # the integration lives in custom_components/
    folders = [p for p in (ROOT / "custom_components").iterdir()
               if p.is_dir() and not p.name.startswith((".", "__"))]
    assert folders == [INTEGRATION]  # one integration per repository
    icon = (INTEGRATION / "brand" / "icon.png").read_bytes()
    assert icon[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", icon[16:24])
    assert width == height == 256


def test_translations_cover_every_entity_service_and_error() -> None:
    assert json.loads((INTEGRATION / "translations" / "en.json").read_text()) == STRINGS
    entity = STRINGS["entity"]
    assert {d.translation_key for d in SENSORS} == set(entity["sensor"])
    assert set(entity["binary_sensor"]) == {"reachable", "remote_lanes"}
    from custom_components.fairlane.config_flow import FairlaneConfigFlow

    kinds = set(FairlaneConfigFlow.async_get_supported_subentry_types(None))  # type: ignore[arg-type]
    assert set(STRINGS["config_subentries"]) == kinds
    for kind in kinds:
        steps = STRINGS["config_subentries"][kind]["step"]
        assert {"user", "reconfigure"} <= set(steps), kind
    services = yaml.safe_load((INTEGRATION / "services.yaml").read_text())
    assert set(services) == set(STRINGS["services"])
    for name, service in services.items():
        assert set(service["fields"]) == set(STRINGS["services"][name]["fields"]), name
    icons = json.loads((INTEGRATION / "icons.json").read_text())
    assert set(icons["services"]) == set(services)
    # Every translation key raised in code exists.
    code = "\n".join(p.read_text() for p in INTEGRATION.glob("*.py"))
    for key in STRINGS["exceptions"]:
        assert f'"{key}"' in code, key
    for key in ("cannot_connect", "invalid_auth", "incompatible_server", "request_refused",
                "path_not_allowed", "path_not_found", "no_entry", "which_entry", "wrong_server",
                "attachment_not_supported"):
        assert key in STRINGS["exceptions"], key


def test_services_yaml_describes_exactly_the_services_the_code_registers() -> None:
    """hassfest's services rule: every registered service is described, nothing else."""
    tree = ast.parse((INTEGRATION / "services.py").read_text())
    registered = {
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "async_register"
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
    }
    described = yaml.safe_load((INTEGRATION / "services.yaml").read_text())
    assert registered and registered == set(described)
    for name, service in described.items():
        for field, spec in (service.get("fields") or {}).items():
            assert "selector" in spec, f"{name}.{field}: hassfest wants a selector"


def test_quality_scale_is_kept() -> None:
    rules = yaml.safe_load((INTEGRATION / "quality_scale.yaml").read_text())["rules"]
    for rule, status in rules.items():
        if isinstance(status, dict):
            assert status["status"] in {"done", "todo", "exempt"}, rule
            if status["status"] == "exempt":
                assert status.get("comment"), f"{rule}: an exemption says why"
        else:
            assert status in {"done", "todo"}, rule
    bronze = {
        "action-setup", "appropriate-polling", "brands", "common-modules",
        "config-flow-test-coverage", "config-flow", "dependency-transparency",
        "docs-actions", "docs-high-level-description", "docs-installation-instructions",
        "docs-removal-instructions", "entity-event-setup", "entity-unique-id",
        "has-entity-name", "runtime-data", "test-before-configure", "test-before-setup",
        "unique-config-entry",
    }
    silver = {
        "action-exceptions", "config-entry-unloading", "docs-configuration-parameters",
        "docs-installation-parameters", "entity-unavailable", "integration-owner",
        "log-when-unavailable", "parallel-updates", "reauthentication-flow",
        "test-coverage",
    }
    for rule in bronze | silver:
        status = rules[rule]
        assert (status if isinstance(status, str) else status["status"]) in {"done", "exempt"}, rule
    assert set(PLATFORMS) == {Platform.AI_TASK, Platform.BINARY_SENSOR, Platform.CONVERSATION,
                              Platform.SENSOR, Platform.STT, Platform.TTS}
