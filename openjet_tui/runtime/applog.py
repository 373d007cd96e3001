"""The app's log file (logs_dir()/openjet.log): one stdlib logging setup for the "openjet" loggers, where the runtime
records every engine decision (chosen or not, with its reason) and the engine worker's lifecycle."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from openjet_tui.runtime.paths import ensure_dir, logs_dir

if TYPE_CHECKING:
    from openjet_tui.runtime.engines import Selection

LOGGER_NAME = "openjet"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_lock = threading.Lock()  # start_engine runs on a worker thread of the app
_handler: logging.FileHandler | None = None


def log_file() -> Path:
    """Where the app's log goes."""
    return logs_dir() / "openjet.log"


def configure_logging() -> Path:
    """Send the "openjet" loggers to log_file(); done once per process (again only if the cache folder moved)."""
    global _handler
    path = log_file()
    with _lock:
        if _handler is not None and Path(_handler.baseFilename) == path:
            return path
        logger = logging.getLogger(LOGGER_NAME)
        if _handler is not None:
            logger.removeHandler(_handler)
            _handler.close()
        ensure_dir(path.parent)
        _handler = logging.FileHandler(path, encoding="utf-8")
        _handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(_handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # the full-screen app owns the terminal: records go to the file only
    return path


def log_selection(selection: Selection, what: str) -> Path:
    """Write every engine decision of `selection` to the log, one line each, and return the log file."""
    path = configure_logging()
    logger = logging.getLogger(f"{LOGGER_NAME}.engines")
    chosen = selection.chosen
    logger.info("%s: %s", what, f"{chosen.label} chosen" if chosen else "no engine can serve")
    for line in selection.lines():
        logger.info("%s: %s", what, line)
    return path
