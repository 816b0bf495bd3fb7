"""Measurement records: the record files and their import (record), their field types (fields), how
a run was made (runcontext), the gate (gating), the ideal (theory) and the bundled workloads. No
torch.
"""
