"""The Hub side of the data flow: the watch list, the crawler, and a local hub that serves the bundled mirror."""
