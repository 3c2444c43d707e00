"""The node agent's HTTP side: API, metrics route and dashboard (``run.run_agent`` starts it all).

Nothing here imports a web framework: ``http.py`` is a small asyncio HTTP/1.1 server (see
docs/agent.md for why), ``static/`` the dashboard (plain JS and SVG, no CDN).
"""
