"""Shipped learned models (package data ``tezip.pretrained``): ``default.safetensors``, the
forecaster ``auto`` may use without adaptation, and ``prednet-v1.safetensors``, the model
format-v1 files name. Each was trained by ``tezip train``; see MODEL_CARD.md."""
