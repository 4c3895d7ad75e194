"""Constants for the Fairlane integration."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

DOMAIN: Final = "fairlane"

DEFAULT_PORT: Final = 8844
DEFAULT_NAME: Final = "Fairlane"
# The server API this integration speaks: a server whose major version differs is refused.
SUPPORTED_MAJOR: Final = 0
SCAN_INTERVAL: Final = timedelta(seconds=10)
REQUEST_TIMEOUT: Final = 10  # seconds, for everything but model work
MODEL_TIMEOUT: Final = 300  # seconds, for a chat turn, a transcription or a search

# Entry data besides host, port and token.
CONF_ADDON_SLUG: Final = "addon_slug"  # set when the entry came from the add-on's discovery

# The kinds of subentry: each is an entity with its own device, and there may be several
# conversation agents (say, one with Assist and one for the children without it).
SUBENTRY_CONVERSATION: Final = "conversation"
SUBENTRY_AI_TASK: Final = "ai_task_data"
SUBENTRY_STT: Final = "stt"
SUBENTRY_TTS: Final = "tts"
DEFAULT_CONVERSATION_NAME: Final = "Fairlane"
DEFAULT_AI_TASK_NAME: Final = "Fairlane AI task"
DEFAULT_STT_NAME: Final = "Fairlane speech-to-text"
DEFAULT_TTS_NAME: Final = "Fairlane text-to-speech"

# The LLM API that lets an agent search the household documents.
DOCUMENTS_API_ID: Final = "fairlane_documents"
DOCUMENTS_API_NAME: Final = "Household documents"
DOCUMENTS_TOP_K: Final = 3
# Cosine similarity from which a question is taken to be about the documents. Measured with
# the default embedder: household questions against their passage 0.53-0.74; commands, small
# talk and general questions against the best passage 0.06-0.25 (docs/history/benchmarks.md).
DOCUMENTS_RELEVANT: Final = 0.45

# Settings of a conversation or AI task subentry.
CONF_PROMPT: Final = "prompt"
CONF_MAX_HISTORY: Final = "max_history"
CONF_CHAT_CLASS: Final = "chat_class"
CONF_AI_TASK_CLASS: Final = "ai_task_class"
CONF_MAX_TOKENS: Final = "max_tokens"
CONF_TEMPERATURE: Final = "temperature"

DEFAULT_MAX_HISTORY: Final = 10
DEFAULT_MAX_TOKENS: Final = 512
# Low: a household assistant should do the same thing when asked the same thing, and small
# models call tools far more reliably near greedy decoding.
DEFAULT_TEMPERATURE: Final = 0.0
# "auto": voice when the turn comes from a voice device (satellite), chat when typed;
# for AI tasks: background when an automation or script asked, chat when a person did.
CLASS_AUTO: Final = "auto"
CLASSES: Final = ("voice", "chat", "background")

# How many model → tool → model rounds one turn may take.
MAX_TOOL_ITERATIONS: Final = 5

# Files the index_documents action sends (the server extracts text from each).
DOCUMENT_TYPES: Final = {
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}

EVENT_SUMMARY_DONE: Final = f"{DOMAIN}_summary_done"
SUMMARY_POLL_S: Final = 2.0
# How long Home Assistant waits for a summary before it stops asking (the job stays on the
# server, and its result can still be read there).
SUMMARY_DEADLINE_S: Final = 3600.0

# Whisper's languages (the multilingual models); an English-only model reports just "en".
WHISPER_LANGUAGES: Final = (
    "af", "am", "ar", "as", "az", "ba", "be", "bg", "bn", "bo", "br", "bs", "ca", "cs", "cy", "da",
    "de", "el", "en", "es", "et", "eu", "fa", "fi", "fo", "fr", "gl", "gu", "ha", "haw", "he",
    "hi", "hr", "ht", "hu", "hy", "id", "is", "it", "ja", "jw", "ka", "kk", "km", "kn", "ko", "la",
    "lb", "ln", "lo", "lt", "lv", "mg", "mi", "mk", "ml", "mn", "mr", "ms", "mt", "my", "ne", "nl",
    "nn", "no", "oc", "pa", "pl", "ps", "pt", "ro", "ru", "sa", "sd", "si", "sk", "sl", "sn", "so",
    "sq", "sr", "su", "sv", "sw", "ta", "te", "tg", "th", "tk", "tl", "tr", "tt", "uk", "ur", "uz",
    "vi", "yi", "yo", "yue", "zh",
)
