"""A team's model files made ready for export, with no TensorFlow.

- ``catalog_file``: the catalog file (Parquet or ``.npz``) of item ids and semantic-ID codes,
  read and checked row by row before anything compiles.
- ``vocabulary``: the token layout's tokens added after a Qwen2/Qwen3 checkpoint's text
  vocabulary (tokenizer, embeddings and tied head resized), and ``xgr_model.json`` written
  beside it (``xgr_common.model_card``).
- ``stand_in``: a random-weight Qwen2/Qwen3 checkpoint and a ``tokenizers``-built tokenizer,
  to try the path where no real checkpoint can be downloaded.
"""
