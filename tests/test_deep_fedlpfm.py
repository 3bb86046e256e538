"""Fed-LPFM and its baselines (asyncopt.deep.fedlpfm; METHODS card "Fed-LPFM")."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
import torch.nn.functional as F  # noqa: E402

from asyncopt.deep import (InProcessTransport, ParameterVector,  # noqa: E402
                           aggregation_weights, run_federated)
from asyncopt.deep.fedlpfm import (PARTITION_NAMES, DistillationLoss,  # noqa: E402
                                   MutualLearningLoss, digits_pools, distillation_loss,
                                   kd_term, make_partition, run_method, student_mlp,
                                   train_teacher)


class RecordingTransport(InProcessTransport):
    """In-process transport that keeps a copy of every vector sent and received."""

    def __init__(self):
        self.sent, self.received = [], []

    def exchange(self, round_index, clients, vector, run_client):
        for client, reply, n in super().exchange(round_index, clients, vector, run_client):
            self.sent.append(np.array(vector, copy=True))
            self.received.append((client, np.array(reply, copy=True), n))
            yield client, reply, n


@pytest.fixture(scope="module")
def small():
    pools = digits_pools(n_public=150, n_test=100, seed=0)
    X, y = pools["X_clients"][:150], pools["y_clients"][:150]
    teacher = train_teacher(pools["X_public"], pools["y_public"], steps=5)
    return X, y, teacher


def state_copy(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# --------------------------------------------------------------------------- partitions

@pytest.mark.parametrize("name", PARTITION_NAMES)
def test_partitions_disjoint_covering_reproducible(name):
    labels = np.random.default_rng(1).integers(0, 10, size=400)
    parts = make_partition(name, labels, 10, seed=3)
    assert len(parts) == 10
    joined = np.concatenate(parts)
    assert joined.size == labels.size                      # disjoint ...
    assert np.array_equal(np.sort(joined), np.arange(labels.size))   # ... and covering
    again = make_partition(name, labels, 10, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = make_partition(name, labels, 10, seed=4)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_class_split_gives_exactly_two_classes_per_client():
    labels = np.random.default_rng(2).integers(0, 10, size=500)
    for seed in range(3):
        parts = make_partition("class_split", labels, 10, seed=seed)
        assert [np.unique(labels[p]).size for p in parts] == [2] * 10


def test_unknown_partition_name_is_rejected():
    with pytest.raises(ValueError):
        make_partition("dirichlet", np.zeros(20, dtype=int), 2)


# --------------------------------------------------------------------------- losses

def test_distillation_loss_matches_a_hand_computation():
    g = torch.Generator().manual_seed(0)
    student = torch.randn(6, 10, generator=g)
    teachers = [torch.randn(6, 10, generator=g), torch.randn(6, 10, generator=g)]
    labels = torch.tensor([0, 3, 9, 1, 1, 5])
    lam, T = 0.3, 3.0

    def kl(p, q):      # KL(p || q), batch mean
        return (p * (p.log() - q.log())).sum(1).mean()

    ps = torch.softmax(student / T, 1)
    pts = [torch.softmax(t / T, 1) for t in teachers]
    ce = -torch.log_softmax(student, 1)[torch.arange(6), labels].mean()
    forward = lam * ce + (1 - lam) * T ** 2 * sum(kl(pt, ps) for pt in pts)
    reverse = lam * ce + (1 - lam) * T ** 2 * sum(kl(ps, pt) for pt in pts)
    got_f = distillation_loss(student, teachers, labels, lam, T, "forward")
    got_r = distillation_loss(student, teachers, labels, lam, T, "reverse")
    assert torch.allclose(got_f, forward, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got_r, reverse, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got_f, got_r)
    # gradients with respect to the student agree with the hand formula, both directions
    for direction in ("forward", "reverse"):
        s1 = student.clone().requires_grad_(True)
        s2 = student.clone().requires_grad_(True)
        distillation_loss(s1, teachers, labels, lam, T, direction).backward()
        p2 = torch.softmax(s2 / T, 1)
        kls = [kl(pt, p2) if direction == "forward" else kl(p2, pt) for pt in pts]
        ce2 = -torch.log_softmax(s2, 1)[torch.arange(6), labels].mean()
        (lam * ce2 + (1 - lam) * T ** 2 * sum(kls)).backward()
        assert torch.allclose(s1.grad, s2.grad, rtol=1e-4, atol=1e-6), direction
    # T^2 scaling: kd_term = T^2 KL at temperature T
    for temp in (1.0, 2.0, 4.0):
        raw = kl(torch.softmax(teachers[0] / temp, 1), torch.softmax(student / temp, 1))
        assert torch.allclose(kd_term(student, teachers[0], temp), temp ** 2 * raw,
                              rtol=1e-5, atol=1e-6)
    # defaults lam = 0.5, T = 3, forward; one tensor = one teacher
    one = distillation_loss(student, teachers[0], labels)
    assert torch.allclose(one, 0.5 * ce + 0.5 * 9.0 * kl(pts[0], ps), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        kd_term(student, teachers[0], direction="sideways")


def test_distillation_gradient_does_not_reach_the_teacher(small):
    X, y, teacher = small
    student = student_mlp()
    loss = DistillationLoss(teacher)(student, torch.as_tensor(X[:8]), torch.as_tensor(y[:8]), 0)
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all(p.grad is not None for p in student.parameters())


# --------------------------------------------------------------------------- protocol

def test_lam_one_reproduces_fedavg_exactly(small):
    X, y, teacher = small
    parts = make_partition("dir0.5", y, 4, seed=0)
    kw = dict(epochs=1, batch_size=16, lr=0.1, seed=5, verbose=False)
    _, fedavg = run_method("fedavg", X, y, parts, 3, **kw)
    _, lam_one = run_method("fedlpfm", X, y, parts, 3, teachers=teacher, lam=1.0, **kw)
    _, lam_half = run_method("fedlpfm", X, y, parts, 3, teachers=teacher, lam=0.5, **kw)
    assert np.array_equal(fedavg.vector, lam_one.vector)
    assert not np.array_equal(fedavg.vector, lam_half.vector)


def test_teacher_is_frozen_and_never_travels(small):
    X, y, teacher = small
    before = state_copy(teacher)
    parts = make_partition("class_split", y, 10, seed=1)
    transport = RecordingTransport()
    model, result = run_method("fedlpfm", X, y, parts, 2, teachers=teacher, epochs=2,
                               lr=0.1, seed=0, verbose=False, transport=transport)
    n_student = sum(p.numel() for p in student_mlp().parameters())
    assert ParameterVector(model).size == n_student
    assert result.vector.size == n_student
    assert len(transport.sent) == 2 * 10 and len(transport.received) == 2 * 10
    assert all(v.size == n_student for v in transport.sent)
    assert all(v.size == n_student for _, v, _ in transport.received)
    assert result.history[-1]["bytes_sent"] == 4 * n_student * 10
    after = teacher.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)     # bit-identical
    assert not any(p.requires_grad for p in teacher.parameters())
    teacher_ids = {id(p) for p in teacher.parameters()}
    assert not teacher_ids & {id(p) for p in model.parameters()}


def test_aggregation_weights_sum_to_one_and_empty_clients_weigh_zero(small):
    assert aggregation_weights([3, 0, 1]) == [0.75, 0.0, 0.25]
    assert aggregation_weights([0, 0]) == [0.0, 0.0]
    X, y, teacher = small
    parts = make_partition("iid", y, 4, seed=0)
    parts.insert(2, np.array([], dtype=np.int64))                 # an empty client
    transport = RecordingTransport()
    model, result = run_method("fedlpfm", X, y, parts, 1, teachers=teacher, lr=0.1,
                               seed=0, verbose=False, transport=transport)
    record = result.history[0]
    assert record["n_samples"][2] == 0 and record["weights"][2] == 0.0
    assert abs(sum(record["weights"]) - 1.0) < 1e-12
    replies = np.stack([v.astype(np.float64) for _, v, _ in transport.received])
    expected = np.tensordot(np.array(record["weights"]), replies, axes=1)
    assert np.allclose(result.vector, expected, rtol=1e-6, atol=1e-7)
    # the empty client returned the global vector unchanged, and it did not count
    assert np.array_equal(transport.received[2][1], transport.sent[2])


def test_fml_keeps_private_models_local(small):
    X, y, _ = small
    parts = make_partition("iid", y, 3, seed=0)
    transport = RecordingTransport()
    kw = dict(epochs=1, lr=0.1, seed=2, verbose=False)
    _, fml = run_method("fml", X, y, parts, 2, transport=transport, **kw)
    _, fedavg = run_method("fedavg", X, y, parts, 2, **kw)
    n_student = sum(p.numel() for p in student_mlp().parameters())
    assert all(v.size == n_student for v in transport.sent)
    assert not np.array_equal(fml.vector, fedavg.vector)
    # private models: initialised per client, and trained by the hook
    hook = MutualLearningLoss(student_mlp, 2, lr=0.1, seed=0)
    start = [state_copy(m) for m in hook.private]
    assert not torch.equal(start[0]["0.weight"], start[1]["0.weight"])
    meme = student_mlp()
    loss = hook(meme, torch.as_tensor(X[:8]), torch.as_tensor(y[:8]), 1)
    loss.backward()
    assert torch.equal(hook.private[0].state_dict()["0.weight"], start[0]["0.weight"])
    assert not torch.equal(hook.private[1].state_dict()["0.weight"], start[1]["0.weight"])
    assert all(p.grad is not None for p in meme.parameters())


def test_student_uses_groupnorm_and_the_same_seed_gives_the_same_run(small):
    X, y, teacher = small
    net = student_mlp()
    assert any(isinstance(m, torch.nn.GroupNorm) for m in net.modules())
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert [tuple(m.weight.shape) for m in net if isinstance(m, torch.nn.Linear)] == \
        [(32, 64), (10, 32)]
    parts = make_partition("dir0.1", y, 4, seed=0)
    runs = [run_method("fedlpfm", X, y, parts, 2, teachers=teacher, lr=0.1, seed=1,
                       verbose=False)[1].vector for _ in range(2)]
    assert np.array_equal(runs[0], runs[1])


def test_teacher_is_imperfect_and_fitted_on_the_public_pool_only():
    """The default experiment's teacher: fitted on the 700 public digits, disjoint from the
    client pool and the test set; strong (the thesis' foundation model knows more than the
    federation) but imperfect: it gets some test digits wrong."""
    pools = digits_pools(seed=0)
    assert len(pools["y_public"]) == 700 and len(pools["y_test"]) == 450
    assert len(pools["y_clients"]) == 1797 - 700 - 450
    rows = {name: {r.tobytes() for r in pools[f"X_{name}"]}
            for name in ("public", "clients", "test")}
    assert not rows["public"] & rows["test"] and not rows["public"] & rows["clients"]
    teacher = train_teacher(pools["X_public"], pools["y_public"])
    from asyncopt.deep.fedlpfm import accuracy
    acc = accuracy(teacher, pools["X_test"], pools["y_test"])
    assert 0.95 <= acc <= 0.99, acc


def test_run_federated_direct_with_distillation_hook(small):
    """The hook composes with run_federated/LocalTrainer directly (no run_method)."""
    from asyncopt.deep import LocalTrainer
    X, y, teacher = small
    parts = make_partition("iid", y, 2, seed=0)
    torch.manual_seed(0)
    model = student_mlp()
    trainer = LocalTrainer(X, y, parts, lr=0.1, batch_loss=DistillationLoss(teacher, 0.5))
    result = run_federated(model, trainer, 2, 1, verbose=False)
    assert result.vector.size == ParameterVector(model).size
    assert F.cross_entropy(model(torch.as_tensor(X)), torch.as_tensor(y)).item() < 10


def test_train_teacher_kinds_are_frozen_reproducible_and_validated():
    pools = digits_pools(n_public=150, n_test=100, seed=0)
    Xp, yp = pools["X_public"], pools["y_public"]
    mlp = train_teacher(Xp, yp, steps=5)                      # default kind: MLP 64-128-10
    linear = train_teacher(Xp, yp, steps=5, kind="linear")
    assert [tuple(m.weight.shape) for m in mlp if isinstance(m, torch.nn.Linear)] == \
        [(128, 64), (10, 128)]
    assert isinstance(linear, torch.nn.Linear) and tuple(linear.weight.shape) == (10, 64)
    for t in (mlp, linear):
        assert not t.training and not any(p.requires_grad for p in t.parameters())
    again = train_teacher(Xp, yp, steps=5)
    assert all(torch.equal(a, b) for a, b in zip(mlp.parameters(), again.parameters()))
    with pytest.raises(ValueError):
        train_teacher(Xp, yp, kind="forest")


def test_validation_split_is_disjoint_covering_and_reproducible():
    from asyncopt.deep.fedlpfm import validation_split
    X = np.arange(50, dtype=np.float32)[:, None]
    y = np.arange(50) % 10
    X_tr, y_tr, X_val, y_val = validation_split(X, y, fraction=0.2, seed=7)
    assert len(y_val) == 10 and len(y_tr) == 40
    both = np.concatenate([X_tr[:, 0], X_val[:, 0]])
    assert np.array_equal(np.sort(both), X[:, 0])            # disjoint and covering
    assert np.array_equal(y_tr, (X_tr[:, 0].astype(int) % 10))   # rows stay paired
    again = validation_split(X, y, fraction=0.2, seed=7)
    assert np.array_equal(again[2], X_val)
