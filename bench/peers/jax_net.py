"""FashionNet and the MLP of tools/mlp_torch.py in JAX (see run_peer.py for what every
peer trains), NHWC, the whole training step (forward, gradient, batch-norm statistics or
the dropout key, Adam) one jit-compiled function whose buffers are donated, so a step
allocates nothing new. Adam is written out here (optax's adam computes the same) to keep
the peer to jax and jaxlib. ResNet-20 is not written in JAX (PyTorch and TensorFlow are
its peers).

The variant "bf16" is mixed precision as JAX users write it (jmp's policy): the float32
parameters and the images cast to bfloat16 inside the loss, the forward in bfloat16, the
logits cast back to float32 for the loss; the gradients arrive float32 through the casts
and Adam updates float32 parameters.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

VARIANTS = ("", "bf16")
EPS, DECAY = 1e-3, 0.99
BETA1, BETA2, ADAM_EPS = 0.9, 0.999, 1e-8


def init(key):
    def he(key, shape, fan_in):
        return jax.random.normal(key, shape, jnp.float32) * np.sqrt(2.0 / fan_in)
    k = jax.random.split(key, 4)
    params = {"conv1": he(k[0], (3, 3, 1, 32), 9), "bn1_gamma": jnp.ones(32), "bn1_beta": jnp.zeros(32),
              "conv2": he(k[1], (3, 3, 32, 64), 288), "bn2_gamma": jnp.ones(64), "bn2_beta": jnp.zeros(64),
              "fc1_w": he(k[2], (3136, 128), 3136), "fc1_b": jnp.zeros(128),
              "fc2_w": he(k[3], (128, 10), 128), "fc2_b": jnp.zeros(10)}
    state = {"bn1_mean": jnp.zeros(32), "bn1_var": jnp.ones(32),
             "bn2_mean": jnp.zeros(64), "bn2_var": jnp.ones(64)}
    return params, state


def forward(params, state, x, training):
    """Logits and the new moving statistics (the old ones when not training)."""
    new_state = dict(state)

    def block(x, i):
        x = lax.conv_general_dilated(x, params[f"conv{i}"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        if training:
            mean, var = x.mean((0, 1, 2)), x.var((0, 1, 2))
            new_state[f"bn{i}_mean"] = DECAY * state[f"bn{i}_mean"] + (1 - DECAY) * mean
            new_state[f"bn{i}_var"] = DECAY * state[f"bn{i}_var"] + (1 - DECAY) * var
        else:
            mean, var = state[f"bn{i}_mean"], state[f"bn{i}_var"]
        x = (x - mean) * (lax.rsqrt(var + EPS) * params[f"bn{i}_gamma"]) + params[f"bn{i}_beta"]
        x = jnp.maximum(x, 0.0)
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    x = block(block(x, 1), 2).reshape(x.shape[0], -1)
    x = jnp.maximum(x @ params["fc1_w"] + params["fc1_b"], 0.0)
    return x @ params["fc2_w"] + params["fc2_b"], new_state


def mlp_init(key, sizes=(784, 512, 256, 10)):
    """He-normal weights, zero biases; the state is the dropout's key."""
    k = jax.random.split(key, len(sizes))
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]), start=1):
        params[f"fc{i}_w"] = jax.random.normal(k[i], (n_in, n_out), jnp.float32) * np.sqrt(2.0 / n_in)
        params[f"fc{i}_b"] = jnp.zeros(n_out)
    return params, {"key": k[0]}


def mlp_forward(params, state, x, training, dropout=0.2):
    """Flatten, Linear + ReLU + dropout per hidden layer, Linear (tools/mlp_torch.py)."""
    layers = len(params) // 2
    x = x.reshape(x.shape[0], -1)
    key, new_key = jax.random.split(state["key"]) if training else (None, state["key"])
    for i in range(1, layers):
        x = jnp.maximum(x @ params[f"fc{i}_w"] + params[f"fc{i}_b"], 0.0)
        if training:
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - dropout), 0.0)
    return x @ params[f"fc{layers}_w"] + params[f"fc{layers}_b"], {"key": new_key}


MODELS = {"fashion_net": (init, forward), "mlp": (mlp_init, mlp_forward)}


def loss_fn(params, state, x, y, forward=forward, compute=jnp.float32):
    if compute != jnp.float32:
        params = jax.tree.map(lambda p: p.astype(compute), params)
        x = x.astype(compute)
    logits, new_state = forward(params, state, x, True)
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked), new_state


def train_step(params, state, adam, x, y, lr, forward=forward, compute=jnp.float32):
    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y, forward,
                                                                     compute)
    t = adam["t"] + 1
    m = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, adam["m"], grads)
    v = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, adam["v"], grads)
    rate = lr * jnp.sqrt(1 - BETA2 ** t) / (1 - BETA1 ** t)
    params = jax.tree.map(lambda p, m, v: p - rate * m / (jnp.sqrt(v) + ADAM_EPS), params, m, v)
    return params, state, {"m": m, "v": v, "t": t}, loss


class Peer:
    def __init__(self, threads, seed, variant, model="fashion_net"):
        if variant not in VARIANTS:
            raise ValueError(f"jax variant {variant!r}; expected one of {VARIANTS}")
        if model not in MODELS:
            raise ValueError(f"jax model {model!r}: only {sorted(MODELS)} are written in JAX")
        init, forward = MODELS[model]
        # XLA's CPU client sizes its thread pool by the CPUs this process may use:
        # compare_peers.py pins the process to `threads` of them.
        self.params, self.state = init(jax.random.PRNGKey(seed))
        zeros = jax.tree.map(jnp.zeros_like, self.params)
        self.adam = {"m": zeros, "v": jax.tree.map(jnp.zeros_like, self.params), "t": jnp.zeros((), jnp.float32)}
        self.lr = jnp.float32(1e-3)
        compute = jnp.bfloat16 if variant == "bf16" else jnp.float32
        self.train_step = jax.jit(functools.partial(train_step, forward=forward, compute=compute),
                                  donate_argnums=(0, 1, 2))
        self.predict_fn = jax.jit(lambda p, s, x: forward(p, s, x, False)[0])
        self.version = jax.__version__
        self.config = (f"whole step jit-compiled{', bf16 compute' if variant == 'bf16' else ''}, NHWC, "
                       f"{threads} CPUs, backend {jax.default_backend()}")

    def step(self, images, labels):
        self.params, self.state, self.adam, loss = self.train_step(
            self.params, self.state, self.adam, images, labels, self.lr)
        return float(loss)

    def predict(self, images):
        return np.asarray(self.predict_fn(self.params, self.state, images))

    def set_lr(self, lr):
        self.lr = jnp.float32(lr)


def build(threads, seed, variant, model="fashion_net"):
    return Peer(threads, seed, variant, model)
