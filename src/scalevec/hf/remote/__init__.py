"""The Hugging Face custom architecture of the strategies that cannot fold (DESIGN.md §10).

``configuration_scalevec.py`` and ``modeling_scalevec.py`` are not imported by scalevec: ``export.py``
copies them into an export directory, whose ``config.json`` names them in ``auto_map``, and
transformers imports them from there (``trust_remote_code=True``). They depend on torch and
transformers only.
"""
