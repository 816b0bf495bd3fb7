"""Engine conformance: the dated records of whether an engine's MTP is lossless (record) and their
statistics (stats).
"""
