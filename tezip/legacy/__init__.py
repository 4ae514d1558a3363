"""Readers of older format versions (their files decode bit for bit forever)."""
