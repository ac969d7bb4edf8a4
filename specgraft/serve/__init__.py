"""OpenAI-compatible server (``specgraft serve``): ``app.py`` (routes, streaming), ``schemas.py``
(request bodies, responses, errors), ``worker.py`` (the one thread that runs the model over the
batch engine), ``metrics.py`` (Prometheus text)."""

from specgraft.serve.app import ServerConfig, create_app
from specgraft.serve.metrics import ServerMetrics
from specgraft.serve.worker import ModelWorker, Piece

__all__ = ["ModelWorker", "Piece", "ServerConfig", "ServerMetrics", "create_app"]
