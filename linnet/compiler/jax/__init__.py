"""The JAX backend (`linnet.compiler.jax`): Core IR to JAX.

- `codegen.generate(program)`: readable, pure JAX source, one function per entry, the KV
  cache threaded through as input and output (no jax import here: the language server shows
  it in-process);
- `module.compile_program(program, numerics=...)`: the generated functions, jitted, with the
  cache donated; `module.export_entry(...)`: an entry as StableHLO through `jax.export`
  (symbolic batch and sequence dims). Binding weights is `linnet.runtimes`' job.
"""
