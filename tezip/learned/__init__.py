"""The learned forecaster: a PredNet-style recurrent network (representation units as
ConvLSTMs, prediction units, error units) that forecasts each frame of a window from the
reconstructed frames before it.

- ``model``: the architecture description, parameter shapes, costs; model files
  (safetensors layout, float16 weights) read and written with numpy only.
- ``runtime``: inference in compiled float32 kernels (``kernels.nn``), the same bytes on
  every machine; decoding never needs torch.
- ``torch_model`` / ``adapt``: the same network in torch, for training (``tezip train``,
  ``--adapt``); imported only there.
"""
