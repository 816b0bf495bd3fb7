"""The family table: the MTP layouts the atlas knows (table) and which tracked models they cover
(coverage). No torch.
"""
