"""Our decoding loop: the checkpoint it loads (checkpoint), the MTP head built from the family
table (mtphead), the fused model (model, layers, kernels, recurrent), the loop itself
(generate), device placement and the cut draft vocabulary.
"""
