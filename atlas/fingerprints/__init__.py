"""Fingerprints: the pure rules that read a stored config and its weight names (rules), the layer-
pattern reader (blockpattern) and the MTP layer's precision (precision). No I/O.
"""
