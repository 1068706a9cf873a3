"""Image generation through an OpenAI-compatible images API.

Generated images that come back inline (base64) are saved in the episode's scratch
directory under ``images/`` and returned by relative path, so the model can pass them
on (to ``vision_analyze``, for instance). Images served by URL are returned as URLs.
File names count up per episode, so a rerun with a deterministic endpoint writes the
same names.
"""

from __future__ import annotations

import base64
import binascii
import logging
from pathlib import Path
from typing import Any

from tools.model_endpoint import API_ERRORS, ModelEndpoint, endpoint_from_options, episode_context
from tools.registry import ToolUnavailable, registry, tool_error, tool_result
from tools.settings import ToolContext, ToolSettings
from tools.vision_tool import sniff_image_type

logger = logging.getLogger(__name__)

TOOLSET = "image_gen"
ENV_PREFIX = "HERMES_IMAGE"
SIZES = ("256x256", "512x512", "1024x1024", "1024x1536", "1536x1024", "1024x1792", "1792x1024")
DEFAULT_SIZE = "1024x1024"
IMAGE_DIR = "images"
_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}


def image_endpoint(settings: ToolSettings) -> ModelEndpoint:
    return endpoint_from_options(settings, TOOLSET, ENV_PREFIX)


def check_image_gen(settings: ToolSettings) -> bool:
    image_endpoint(settings)
    return True


def _next_path(ctx: ToolContext, extension: str) -> Path:
    folder = ctx.scratch_dir / IMAGE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    count = int(ctx.state.get("image_gen_count", 0))
    while True:
        count += 1
        path = folder / f"image_{count:03d}.{extension}"
        if not path.exists():
            ctx.state["image_gen_count"] = count
            return path


def save_image(ctx: ToolContext, b64: str) -> dict[str, Any]:
    """Decode one base64 image into the scratch directory; returns its result entry."""
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return {"error": "the endpoint returned image data that is not valid base64"}
    mime = sniff_image_type(data)
    path = _next_path(ctx, _EXTENSIONS.get(mime or "", "png"))
    path.write_bytes(data)
    return {"path": path.relative_to(ctx.scratch_dir).as_posix(), "bytes": len(data)}


async def _generate(
    endpoint: ModelEndpoint, settings: ToolSettings, prompt: str, size: str
) -> list[Any]:
    params: dict[str, Any] = {"model": endpoint.model, "prompt": prompt, "size": size, "n": 1}
    # Only some models accept response_format; without it each returns its default form.
    response_format = settings.option(TOOLSET, "response_format")
    if response_format:
        params["response_format"] = response_format
    async with endpoint.client(settings, TOOLSET) as client:
        response = await client.images.generate(**params)
    return list(response.data or [])


async def image_generate(args: dict[str, Any], **kwargs: Any) -> str:
    ctx = episode_context(kwargs)
    if ctx is None:
        return tool_error("image_generate needs an episode context (ctx) to run")
    prompt = args.get("prompt")
    size = args.get("size") or DEFAULT_SIZE
    if not isinstance(prompt, str) or not prompt.strip():
        return tool_error("prompt must be a non-empty string")
    if size not in SIZES:
        return tool_error(f"size must be one of {', '.join(SIZES)}")
    try:
        endpoint = image_endpoint(ctx.settings)
    except ToolUnavailable as exc:
        return tool_error(f"image_generate: {exc}")
    try:
        items = await _generate(endpoint, ctx.settings, prompt, str(size))
    except API_ERRORS as exc:
        return tool_error(f"image model failed: {endpoint.describe_error(exc, ctx.settings)}")
    images: list[dict[str, Any]] = []
    revised: list[str] = []
    for item in items:
        if getattr(item, "b64_json", None):
            images.append(save_image(ctx, item.b64_json))
        elif getattr(item, "url", None):
            images.append({"url": item.url})
        if getattr(item, "revised_prompt", None):
            revised.append(item.revised_prompt)
    if not images:
        return tool_error("the image endpoint returned no image")
    result: dict[str, Any] = {"images": images, "model": endpoint.model}
    if revised:
        result["revised_prompt"] = revised[0]
    return tool_result(result)


IMAGE_SCHEMA = {
    "name": "image_generate",
    "description": (
        "Generate an image from a text description. The image is saved in your working "
        "directory and its path is returned (or a URL when the service hosts it)."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "prompt": {
                "type": "string",
                "description": "A detailed description of the image: subject, style, composition.",
            },
            "size": {
                "type": "string",
                "enum": list(SIZES),
                "description": f"Width x height in pixels (default {DEFAULT_SIZE}).",
            },
        },
        "required": ["prompt"],
    },
}

registry.register(
    name="image_generate",
    toolset=TOOLSET,
    schema=IMAGE_SCHEMA,
    handler=image_generate,
    check_fn=check_image_gen,
    is_async=True,
    emoji="🎨",
)
