"""The PyTorch backend (`linnet.compiler.torch`): Core IR to PyTorch.

- `codegen.generate(program)`: readable PyTorch source, one function per entry (no torch
  import here: the language server shows it in-process);
- `module.compile_program(program, mode=...)`: an `nn.Module` whose `state_dict` keys are the
  checkpoint names, running the IR in one of the modes of ARCHITECTURE.md ("interpret",
  "generated", "inductor", "cuda-graphs"). Binding weights is `linnet.runtimes`' job.
"""
