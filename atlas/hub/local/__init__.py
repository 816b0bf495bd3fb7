"""The local hub: a Hub-shaped HTTP server over a folder (server, handlers) and the bundled mirror
it serves (mirror), for the demo and the tests.
"""
