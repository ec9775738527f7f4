"""TF<->Torch meeting point: DLPack hand-off, Torch layers in TF, migration and parity."""
