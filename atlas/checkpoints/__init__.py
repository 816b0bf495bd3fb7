"""Checkpoint builders: the oracles with known answers, layer cuts, the bundled byte-level team
model (team_model, team_corpus, team_checkpoint), the real SmolLM2 checkpoint (smollm) and its
MTP head's training (headtrain).
"""
