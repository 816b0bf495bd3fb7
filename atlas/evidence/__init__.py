"""The evidence files under evidence/ (the support matrix, the reported figures, the measurement
records, the changelog's data) read into typed models: below the site, which renders them, and
beside the store, whose imports say which records count."""
