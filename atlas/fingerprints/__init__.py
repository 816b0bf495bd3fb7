"""Fingerprints: the pure rules that read a stored config and its weight names (rules), the layer-
pattern reader (blockpattern), the MTP layer's precision (precision), the GGUF header reader (gguf)
and the form a repo ships MTP in, with the head's facts (form). No I/O.
"""
