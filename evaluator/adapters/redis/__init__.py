"""The Redis state store (standalone or Cluster): checkpoints by Lua script, blocks, sketches."""
