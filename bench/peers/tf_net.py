"""The peers' models in TensorFlow 2 with Keras 3 layers (see run_peer.py for what every
peer trains), NHWC, the whole training step one tf.function: FashionNet, the MLP of
tools/mlp_torch.py, the ResNet-20 of tools/resnet_torch.py and the small ViT of
tools/vit_torch.py, layer for layer (batch norm with towerlab's constants, as FashionNet's).

Variants (run_peer.py --variant): "" is the best configuration measured on the 2-core
machines (bench/results/cpu_peers.md): a TensorFlow graph running oneDNN's kernels,
about 2.5 times XLA's speed there. "xla" compiles the step with XLA (jit_compile=True).
"mixed_bfloat16" runs the graph under Keras's mixed_bfloat16 policy (bfloat16 compute,
float32 variables; the logits cast to float32 for the loss).
"""
import os

# Before TensorFlow loads: oneDNN's CPU kernels (the default on x86 Linux, stated so
# that a changed default cannot change the peer), and only its errors on stderr.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402

VARIANTS = ("", "xla", "mixed_bfloat16")


def fashion_net():
    # Keras's BatchNormalization momentum is TensorFlow's decay, as towerlab's.
    def block(filters):
        return [layers.Conv2D(filters, 3, padding="same", use_bias=False),
                layers.BatchNormalization(momentum=0.99, epsilon=1e-3), layers.ReLU(),
                layers.MaxPooling2D(2)]
    return keras.Sequential([keras.Input((28, 28, 1)), *block(32), *block(64), layers.Flatten(),
                             layers.Dense(128, activation="relu"), layers.Dense(10)])


def mlp(hidden=(512, 256), classes=10, dropout=0.2):
    # tools/mlp_torch.py: flatten, Linear + ReLU + Dropout per hidden layer, Linear.
    body = [layer for n in hidden for layer in (layers.Dense(n, activation="relu"), layers.Dropout(dropout))]
    return keras.Sequential([keras.Input((28, 28, 1)), layers.Flatten(), *body, layers.Dense(classes)])


def resnet(width=16, blocks_per_stage=3, classes=10):
    # tools/resnet_torch.py: stem conv 3x3 + BN + ReLU, 3 stages of basic blocks (the
    # first of stages 2 and 3 with stride 2 and a 1x1 conv + BN projection), global
    # average pooling, linear.
    def conv(filters, kernel, stride=1):
        return layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False)

    def bn():
        return layers.BatchNormalization(momentum=0.99, epsilon=1e-3)

    inputs = keras.Input((28, 28, 1))
    x = layers.ReLU()(bn()(conv(width, 3)(inputs)))
    channels = width
    for s in range(3):
        out = width << s
        for b in range(blocks_per_stage):
            stride = 2 if s > 0 and b == 0 else 1
            y = layers.ReLU()(bn()(conv(out, 3, stride)(x)))
            y = bn()(conv(out, 3)(y))
            shortcut = bn()(conv(out, 1, stride)(x)) if stride != 1 or channels != out else x
            x = layers.ReLU()(layers.Add()([y, shortcut]))
            channels = out
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(classes)(x))


class Positions(layers.Layer):
    """The learned positions, one [T, D] variable added to every sample's tokens."""

    def build(self, shape):
        self.position = self.add_weight(shape=tuple(shape[1:]), name="position",
                                        initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x):
        return x + self.position


def vit(image=28, patch=4, dim=64, heads=4, blocks=4, mlp_ratio=2, classes=10, dropout=0.1):
    # tools/vit_torch.py: the patches' convolution (stride = patch), learned positions,
    # dropout, pre-norm blocks (layer norm, multi-head self-attention with its q, k, v and
    # output projections, dropout, residual; layer norm, linear, GELU (erf), dropout,
    # linear, dropout, residual), a final layer norm, the mean over the tokens, the head.
    # Layer norm's epsilon is PyTorch's and towerlab's 1e-5 (Keras's default is 1e-3).
    def norm():
        return layers.LayerNormalization(epsilon=1e-5)

    inputs = keras.Input((image, image, 1))
    tokens = (image // patch) ** 2
    x = layers.Reshape((tokens, dim))(layers.Conv2D(dim, patch, patch)(inputs))
    x = layers.Dropout(dropout)(Positions()(x))
    for _ in range(blocks):
        y = norm()(x)
        y = layers.MultiHeadAttention(heads, dim // heads)(y, y)
        x = layers.Add()([x, layers.Dropout(dropout)(y)])
        y = layers.Dense(mlp_ratio * dim, activation="gelu")(norm()(x))
        y = layers.Dense(dim)(layers.Dropout(dropout)(y))
        x = layers.Add()([x, layers.Dropout(dropout)(y)])
    x = layers.GlobalAveragePooling1D()(norm()(x))
    return keras.Model(inputs, layers.Dense(classes)(x))


MODELS = {"fashion_net": fashion_net, "mlp": mlp, "resnet": resnet, "vit": vit}


class Peer:
    def __init__(self, threads, seed, variant, model="fashion_net"):
        if variant not in VARIANTS:
            raise ValueError(f"tensorflow variant {variant!r}; expected one of {VARIANTS}")
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        keras.utils.set_random_seed(seed)
        keras.mixed_precision.set_global_policy(
            "mixed_bfloat16" if variant == "mixed_bfloat16" else "float32")
        self.model = MODELS[model]()
        self.opt = keras.optimizers.Adam(learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8)
        model, opt = self.model, self.opt

        @tf.function(jit_compile=variant == "xla")
        def train_step(x, y):
            with tf.GradientTape() as tape:
                logits = tf.cast(model(x, training=True), tf.float32)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        self.train_step = train_step
        self.version = tf.__version__
        self.config = (f"{'XLA' if variant == 'xla' else 'graph, oneDNN'}"
                       f"{', mixed_bfloat16' if variant == 'mixed_bfloat16' else ''}, NHWC, {threads} threads, "
                       f"Keras {keras.__version__}")

    def step(self, images, labels):
        return float(self.train_step(images, labels))

    def predict(self, images):
        return self.model(images, training=False).numpy()

    def set_lr(self, lr):
        self.opt.learning_rate.assign(lr)


def build(threads, seed, variant, model="fashion_net"):
    return Peer(threads, seed, variant, model)
