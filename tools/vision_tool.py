"""Image understanding through an OpenAI-compatible vision model.

The image is a web URL (passed to the model server as is) or a file in the episode's
scratch directory (sent inline as a base64 data URL, so the server needs no access to
the worker's disk).
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

from openai.types.chat import ChatCompletionMessageParam

from tools.model_endpoint import (
    API_ERRORS,
    ModelEndpoint,
    complete,
    endpoint_from_options,
    episode_context,
)
from tools.registry import ToolUnavailable, registry, tool_error, tool_result
from tools.settings import ToolContext, ToolSettings

logger = logging.getLogger(__name__)

TOOLSET = "vision"
ENV_PREFIX = "HERMES_VISION"
DEFAULT_MAX_IMAGE_BYTES = 10 * 1024 * 1024
DEFAULT_QUESTION = "Describe this image in detail."

# Magic numbers of the formats vision models accept; the extension alone can lie.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image_type(data: bytes) -> str | None:
    """The MIME type of PNG, JPEG, GIF or WebP bytes, else None."""
    for signature, mime in _SIGNATURES:
        if data.startswith(signature):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def vision_endpoint(settings: ToolSettings) -> ModelEndpoint:
    return endpoint_from_options(settings, TOOLSET, ENV_PREFIX)


def check_vision(settings: ToolSettings) -> bool:
    vision_endpoint(settings)
    return True


class ImageInputError(ValueError):
    """The image argument cannot be used; the message is shown to the model."""


def scratch_file(ctx: ToolContext, relative: str) -> Path:
    """Resolve ``relative`` inside the scratch directory, refusing anything outside it."""
    scratch = ctx.scratch_dir.resolve()
    # resolve() follows symlinks, so a link pointing outside is refused too.
    resolved = (scratch / relative).resolve()
    if not resolved.is_relative_to(scratch):
        raise ImageInputError(f"{relative!r} is outside the scratch directory")
    if not resolved.is_file():
        raise ImageInputError(f"no such file in the scratch directory: {relative!r}")
    return resolved


def image_reference(image: str, ctx: ToolContext) -> str:
    """The ``image_url`` value to send: a web URL as is, a scratch file as a data URL."""
    lowered = image.lower()
    if lowered.startswith(("http://", "https://", "data:image/")):
        return image
    if "://" in image:
        raise ImageInputError("image_url must be an http(s) URL or a path in the scratch directory")
    path = scratch_file(ctx, image)
    limit = int(ctx.settings.option(TOOLSET, "max_image_bytes", default=DEFAULT_MAX_IMAGE_BYTES))
    size = path.stat().st_size
    if size > limit:
        raise ImageInputError(f"{image!r} is {size} bytes; the limit is {limit} bytes")
    data = path.read_bytes()
    mime = sniff_image_type(data)
    if mime is None:
        raise ImageInputError(f"{image!r} is not a PNG, JPEG, GIF or WebP image")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


async def vision_analyze(args: dict[str, Any], **kwargs: Any) -> str:
    ctx = episode_context(kwargs)
    if ctx is None:
        return tool_error("vision_analyze needs an episode context (ctx) to run")
    image = args.get("image_url")
    question = args.get("question") or DEFAULT_QUESTION
    if not isinstance(image, str) or not image.strip():
        return tool_error("image_url must be a non-empty string")
    if not isinstance(question, str):
        return tool_error("question must be a string")
    try:
        endpoint = vision_endpoint(ctx.settings)
        url = image_reference(image.strip(), ctx)
    except (ToolUnavailable, ImageInputError) as exc:
        return tool_error(f"vision_analyze: {exc}")
    messages: list[ChatCompletionMessageParam] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]
    max_tokens = ctx.settings.option(TOOLSET, "max_tokens")
    try:
        answer = await complete(
            endpoint,
            ctx.settings,
            TOOLSET,
            messages,
            max_tokens=int(max_tokens) if max_tokens else None,
        )
    except API_ERRORS as exc:
        return tool_error(f"vision model failed: {endpoint.describe_error(exc, ctx.settings)}")
    return tool_result(analysis=answer, model=endpoint.model)


VISION_SCHEMA = {
    "name": "vision_analyze",
    "description": (
        "Look at an image and answer a question about it (describe it, read text in it, "
        "find details). The image is an http(s) URL or the path of an image file in your "
        "working directory (PNG, JPEG, GIF or WebP)."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "image_url": {
                "type": "string",
                "description": "An http(s) image URL, or a path relative to the working directory.",
            },
            "question": {
                "type": "string",
                "description": "What to find out about the image.",
            },
        },
        "required": ["image_url", "question"],
    },
}

registry.register(
    name="vision_analyze",
    toolset=TOOLSET,
    schema=VISION_SCHEMA,
    handler=vision_analyze,
    check_fn=check_vision,
    is_async=True,
    emoji="👁️",
)
