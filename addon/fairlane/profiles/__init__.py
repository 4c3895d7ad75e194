"""Cost profiles shipped with Fairlane: fitted from measurements (`fit.py`, `data/`) or, where
no device was at hand, estimated from published figures (each file says which)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import voluptuous as vol
import yaml

from fairlane.policy import CostProfile, EmbedCost, LlmCost, SttCost, TtsCost
from fairlane.policy.cost import DEFAULT_TTS, HostCost

_NUMBER = vol.All(vol.Coerce(float), vol.Range(min=0))
PROFILE_SCHEMA = vol.Schema(
    {
        vol.Required("name"): str,
        vol.Optional("description", default=""): str,
        vol.Required("device"): vol.In(["cpu", "gpu"]),
        vol.Required("llm"): {
            vol.Required("base_ms"): _NUMBER,
            vol.Required("prefill_token_ms"): _NUMBER,
            vol.Required("decode_seq_ms"): _NUMBER,
            vol.Optional("context_token_us", default=0.0): _NUMBER,
            vol.Optional("prefill_base_ms", default=0.0): _NUMBER,
            vol.Optional("attention_ns", default=0.0): _NUMBER,
            vol.Optional("prefill_attention_ns", default=0.0): _NUMBER,
            # A step right after other engines' on the same loop (cost.LlmCost.switch_share).
            vol.Optional("switch_share", default=0.0): _NUMBER,
        },
        vol.Required("embed"): {
            vol.Required("base_ms"): _NUMBER,
            vol.Required("token_ms"): _NUMBER,
        },
        vol.Required("stt"): {
            vol.Required("base_ms"): _NUMBER,
            vol.Required("utterance_ms"): _NUMBER,
            vol.Optional("audio_s_ms", default=0.0): _NUMBER,
        },
        vol.Optional("tts"): {
            vol.Required("base_ms"): _NUMBER,
            vol.Required("phoneme_ms"): _NUMBER,
        },
        # The host around the device (cost.HostCost): what the simulator adds between steps.
        vol.Optional("host"): {vol.Optional("round_trip_ms", default=0.0): _NUMBER},
        # A fitted profile's error on the measurements it came from (`fairlane profile fit`).
        vol.Optional("fit_error"): dict,
    }
)


def available() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(
        p.name.removesuffix(".yaml")
        for p in resources.files(__package__).iterdir()
        if p.name.endswith(".yaml")
    )


def load(name_or_path: str) -> tuple[CostProfile, str]:
    """A profile by shipped name or YAML path, and its device type ('cpu' or 'gpu')."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text()
    elif name_or_path in available():
        text = resources.files(__package__).joinpath(f"{name_or_path}.yaml").read_text()
    else:
        raise ValueError(
            f"unknown profile {name_or_path!r}; shipped: {', '.join(available())}, or a YAML path"
        )
    try:
        data = PROFILE_SCHEMA(yaml.safe_load(text))
    except vol.Invalid as err:
        raise ValueError(f"profile {name_or_path!r}: {err}") from err
    profile = CostProfile(
        name=data["name"],
        description=data["description"],
        llm=LlmCost(**data["llm"]),
        embed=EmbedCost(**data["embed"]),
        stt=SttCost(**data["stt"]),
        tts=TtsCost(**data["tts"]) if "tts" in data else DEFAULT_TTS,
        host=HostCost(**data.get("host", {})),
    )
    return profile, data["device"]
