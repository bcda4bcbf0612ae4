"""Serving metrics: what a run computes from its requests (serving), which extras it reports
(options) and the `/metrics` page (page)."""
