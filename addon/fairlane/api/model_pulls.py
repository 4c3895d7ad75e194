"""Pulling models over HTTP: `POST /v1/models/pull` starts (or joins) a durable pull job,
`GET` polls it (bytes done and total, rate, time left, then done / failed / cancelled),
`DELETE` cancels it (its bytes are kept: a later pull goes on from them). See runtime.pulls."""

from __future__ import annotations

import asyncio

import voluptuous as vol
from aiohttp import web

from fairlane.api.common import ApiError, Services, read_json, services_of
from fairlane.api.openapi import operation
from fairlane.engines import catalogue, pull
from fairlane.engines.models import ModelError
from fairlane.runtime.pulls import BackgroundPull, PullJobs

PULL_REQUEST = vol.Schema(
    {vol.Required("model", description="a catalogue name, hf:OWNER/REPO/FILE.gguf or "
                  "OWNER/REPO:QUANT"): vol.All(str, vol.Length(min=1, max=300))},
    extra=vol.PREVENT_EXTRA,
)


@operation("Start pulling a model (or join its pull): a durable job", ok={202: "the job"},
           errors=(400, 401), json=PULL_REQUEST)
async def start_pull(request: web.Request) -> web.Response:
    jobs = _jobs(services_of(request))
    body = await read_json(request)
    try:  # resolving a quantisation may ask the hub: off the event loop
        job = await asyncio.to_thread(jobs.start, body["model"])
    except ModelError as err:
        raise ApiError(400, str(err), param="model") from err
    return web.json_response(job.as_dict(), status=202)


@operation("The catalogue's models, each with whether it is here and fits this machine",
           errors=(401,))
async def list_catalogue(request: web.Request) -> web.Response:
    svc = services_of(request)
    gpu_gb = None  # the server sees no GPU's memory here; a CPU tier unless configured
    tier = catalogue.this_machine(gpu_gb)
    fits = {e.name for role in catalogue.ROLES for e in catalogue.recommended(role, tier)}
    here = {name for name, _ in await asyncio.to_thread(pull.pulled)}
    data = []
    for entry in catalogue.load():
        pulled = entry.packaged or (
            entry.repo is not None and f"{entry.repo}/{entry.file}" in here)
        data.append({
            "id": entry.name, "object": "model.catalogue", "role": entry.role,
            "tiers": list(entry.tiers), "size_mb": entry.size_mb, "licence": entry.licence,
            "context": entry.context, "tool_calls": entry.tool_calls, "assist": entry.assist,
            "why": entry.why, "here": pulled, "fits": entry.name in fits,
            "serving": entry.name == svc.model_name,
        })
    return web.json_response({"object": "list", "tier": tier, "data": data})


@operation("The pull jobs", errors=(401,))
async def list_pulls(request: web.Request) -> web.Response:
    jobs = _jobs(services_of(request))
    return web.json_response({"object": "list", "data": [j.as_dict() for j in jobs.pulls]})


@operation("One pull job: bytes done and total, rate, time left, state", errors=(401, 404))
async def get_pull(request: web.Request) -> web.Response:
    return web.json_response(_job(request).as_dict())


@operation("Cancel a pull (its bytes are kept for a later pull)", errors=(401, 404))
async def cancel_pull(request: web.Request) -> web.Response:
    job = _job(request)
    job.cancel()
    return web.json_response(job.as_dict())


def _jobs(svc: Services) -> PullJobs:
    if svc.pulls is None:
        raise ApiError(404, "this server pulls no models", code="not_found")
    return svc.pulls


def _job(request: web.Request) -> BackgroundPull:
    job_id = request.match_info["id"]
    found = _jobs(services_of(request)).find(job_id)
    if found is None:
        raise ApiError(404, f"no pull {job_id!r}", code="not_found")
    return found
