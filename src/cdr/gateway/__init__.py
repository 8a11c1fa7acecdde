"""HTTP gateway: FastAPI app, routes, CRP headers, session stores, settings and metrics."""
