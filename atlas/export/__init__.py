"""`atlas export`: the store's tables as Parquet and CSV (tables), the dataset card and
croissant.json (docs, croissant) and the shared CSV and path conventions (formats).
"""
