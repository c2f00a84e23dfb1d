"""The program of the dropout tests of both backends (test_dropout.py, test_jax_dropout.py): dropout in a module's
method (inlined into the entry), twice on one tensor, and in a free function called once and twice."""

P = 0.25
SOURCE = f"""
config Net {{
    hidden: int = 256
}}

module Noisy(p: float) {{
    fn forward(x: [B, N]) -> [B, N] {{
        dropout(x, p)
    }}
}}

fn noise_twice(x: [B, N]) -> [B, N] {{
    let a = dropout(x, {P})
    let b = exp(a)
    a - dropout(x, {P}) + b - exp(a)
}}

model Dropper(c: Net) {{
    noisy: Noisy({P})

    entry fn forward(x: [B, c.hidden]) -> [B, c.hidden] {{
        noisy(x)
    }}

    entry fn twice(x: [B, c.hidden]) -> [B, c.hidden] {{
        dropout(x, {P}) - dropout(x, {P})
    }}

    entry fn free(x: [B, c.hidden]) -> [B, c.hidden] {{
        noise_twice(x)
    }}

    entry fn calls(x: [B, c.hidden]) -> [B, c.hidden] {{
        noise_twice(x) - noise_twice(x)
    }}
}}
"""
