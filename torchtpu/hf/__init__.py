"""The Hugging Face integrations, each through transformers' public hooks:

* ``generation``: ``StaticGenerator`` (compiled forward, static KV cache,
  bucketed prompts) around ``model.generate``;
* ``serve``: transformers' OpenAI-compatible server on tpu
  (``python -m torchtpu.serve``);
* ``testing``: the device spec transformers' test suite loads
  (``TRANSFORMERS_TEST_DEVICE_SPEC``);
* ``quantizers``: torchtpu's packed FP8 / MXFP4 quantizers, registered with
  transformers' quantizer registry (``torchtpu.quant.packed_config``).

Nothing here is imported by ``import torchtpu``: transformers is optional.
The public paths ``torchtpu.generation``, ``torchtpu.serve`` and
``torchtpu.testing`` re-export these modules.
"""
