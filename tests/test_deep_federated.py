"""Federated rounds over flat float32 vectors (asyncopt.deep.federated): FedAvg with one
client is local training, the server's average is the sample-weighted mean, the FedProx
term has gradient mu (w - w_global), bytes follow 4 P m per round, and a run under
mpirun gives the in-process result."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from asyncopt.deep.federated import (LocalTrainer, ParameterVector, client_ranks,  # noqa: E402
                                     fedprox_term, run_federated)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
SCRIPT = os.path.join(os.path.dirname(__file__), "mpi", "deep_federated_round.py")


def bn_net(seed=0, n_in=6, n_out=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(n_in, 10), torch.nn.BatchNorm1d(10),
                               torch.nn.ReLU(), torch.nn.Linear(10, n_out))


def synthetic(n=200, n_in=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, n_in)).astype(np.float32)
    y = np.argmax(X[:, :3] + 0.5 * rng.standard_normal((n, 3)), axis=1)
    return X, y


def float_state(model):
    """Every parameter and floating-point buffer by name (numpy copies)."""
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()
            if torch.is_floating_point(v)}


def vector_length(model):
    """P counted from the model itself: parameters plus floating-point buffers."""
    return (sum(p.numel() for p in model.parameters())
            + sum(b.numel() for b in model.buffers() if torch.is_floating_point(b)))


def test_parameter_vector_round_trip_and_layout():
    model = bn_net()
    flat = ParameterVector(model)
    assert flat.size == vector_length(model) and flat.nbytes == 4 * flat.size
    assert "1.running_mean" in flat.names and "1.num_batches_tracked" not in flat.names
    v = flat.get()
    assert v.dtype == np.float32 and v.shape == (flat.size,)
    target = np.arange(flat.size, dtype=np.float32)
    flat.set(target)
    assert np.array_equal(flat.get(), target)
    assert np.array_equal(model[0].weight.detach().numpy().ravel(),
                          target[:model[0].weight.numel()])
    assert ParameterVector(model, buffers=False).size == \
        sum(p.numel() for p in model.parameters())


def test_fedavg_with_one_client_is_plain_local_training():
    """One client, full participation: every round sends w_r to the client and takes its
    vector back unchanged (weight n / n = 1), so R rounds of E epochs equal R E epochs of
    SGD on its data in the batch order the trainer documents."""
    X, y = synthetic()
    rounds, epochs, batch, lr, seed = 3, 2, 32, 0.1, 4
    trainer = LocalTrainer(X, y, [np.arange(len(y))], epochs=epochs, batch_size=batch,
                           lr=lr, seed=seed)
    federated = bn_net(1)
    result = run_federated(federated, trainer, 1, rounds, verbose=False)

    plain = bn_net(1)
    optimizer = torch.optim.SGD(plain.parameters(), lr=lr)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    for r in range(rounds):
        rng = np.random.default_rng([seed, r, 0])
        rng.integers(2 ** 63)                  # the draw that seeds torch's RNG
        for _ in range(epochs):
            order = rng.permutation(len(y))
            for start in range(0, len(y), batch):
                idx = torch.from_numpy(order[start:start + batch])
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(plain(Xt[idx]), yt[idx]).backward()
                optimizer.step()
    expected, got = float_state(plain), float_state(federated)
    assert all(np.array_equal(expected[k], got[k]) for k in expected)
    assert np.array_equal(result.vector, ParameterVector(plain).get())
    assert not np.array_equal(expected["0.weight"], float_state(bn_net(1))["0.weight"])


def test_local_trainer_batches_and_a_lone_last_sample():
    """Batches follow the documented order; a last batch of one sample (which BatchNorm
    cannot train on) joins the batch before it."""
    X, y = synthetic(n=70)
    sizes = []

    def loss_fn(output, target):
        sizes.append(len(target))
        return torch.nn.functional.cross_entropy(output, target)
    part = np.arange(5, 70)                                  # 65 = 2 * 32 + 1 samples
    n = LocalTrainer(X, y, [part], epochs=2, batch_size=32, loss_fn=loss_fn)(bn_net(), 0, 0)
    assert n == 65 and sizes == [32, 33, 32, 33]


def stub_trainer(counts):
    """A local update that sets every float tensor to values drawn from (client, round)
    and reports counts[client] samples."""
    def local_train(model, client, round_index):
        rng = np.random.default_rng([client, round_index])
        with torch.no_grad():
            for v in model.state_dict().values():
                if torch.is_floating_point(v):
                    v.copy_(torch.from_numpy(rng.standard_normal(v.shape).astype(np.float32)))
        return counts[client]
    return local_train


def stub_values(client, round_index):
    """What stub_trainer leaves in ``model`` for this client and round."""
    probe = bn_net()
    stub_trainer({client: 0})(probe, client, round_index)
    return float_state(probe)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_server_average_is_the_sample_weighted_mean(fraction):
    counts = {0: 30, 1: 5, 2: 0, 3: 17, 4: 48, 5: 1}
    model = bn_net()
    tracked_before = int(model[1].num_batches_tracked)
    result = run_federated(model, stub_trainer(counts), 6, 2, client_fraction=fraction,
                           seed=3, verbose=False)
    last = result.history[-1]
    participants = last["participants"]
    assert len(participants) == (6 if fraction == 1.0 else 3)
    assert participants == sorted(set(participants))
    assert last["n_samples"] == [counts[c] for c in participants]
    weights = np.array([counts[c] for c in participants], dtype=np.float64)
    got = float_state(model)
    for name in got:
        stack = np.stack([stub_values(c, 1)[name] for c in participants])
        expected = np.tensordot(weights / weights.sum(), stack.astype(np.float64), axes=1)
        assert np.allclose(got[name], expected, rtol=1e-6, atol=1e-7), name
    assert int(model[1].num_batches_tracked) == tracked_before     # integer buffers stay


def test_partial_participation_is_seeded():
    counts = dict.fromkeys(range(8), 1)
    runs = [run_federated(bn_net(), stub_trainer(counts), 8, 6, client_fraction=0.25,
                          seed=s, verbose=False).history for s in (7, 7, 8)]
    chosen = [[h["participants"] for h in history] for history in runs]
    assert chosen[0] == chosen[1] and chosen[0] != chosen[2]
    assert len({tuple(c) for c in chosen[0]}) > 1          # a fresh draw every round
    assert all(len(c) == 2 for c in chosen[0])


def test_all_zero_weights_keep_the_global_vector():
    model = bn_net()
    before = ParameterVector(model).get()
    result = run_federated(model, stub_trainer(dict.fromkeys(range(3), 0)), 3, 1,
                           verbose=False)
    assert np.array_equal(result.vector, before)
    assert np.array_equal(ParameterVector(model).get(), before)


def test_fedprox_term_gradient_is_mu_times_the_drift():
    rng = np.random.default_rng(0)
    mu = 0.37
    w = [torch.tensor(rng.standard_normal(s), requires_grad=True) for s in [(3, 4), (5,)]]
    w_global = [torch.tensor(rng.standard_normal(s)) for s in [(3, 4), (5,)]]
    term = fedprox_term(w, w_global, mu)
    term.backward()
    drift = [a.detach().numpy() - b.numpy() for a, b in zip(w, w_global)]
    assert np.isclose(term.item(), mu / 2 * sum(np.sum(d ** 2) for d in drift), rtol=1e-14)
    for param, d in zip(w, drift):
        assert np.allclose(param.grad.numpy(), mu * d, rtol=1e-14, atol=1e-15)


def test_fedprox_keeps_the_client_close_to_the_global_model():
    X, y = synthetic()
    start = ParameterVector(bn_net(2)).get()
    drift = {}
    for mu in (0.0, 50.0):
        model = bn_net(2)
        LocalTrainer(X, y, [np.arange(len(y))], epochs=3, lr=0.01, mu=mu)(model, 0, 0)
        params = ParameterVector(model, buffers=False)
        drift[mu] = np.linalg.norm(params.get() - start[:params.size])
    assert drift[50.0] < 0.5 * drift[0.0]


def test_bytes_follow_4_p_m_per_round(capsys):
    X, y = synthetic()
    parts = [np.arange(k, len(y), 4) for k in range(4)]
    model = bn_net()
    P = vector_length(model)
    result = run_federated(model, LocalTrainer(X, y, parts), 4, 3, client_fraction=0.5,
                           evaluate=lambda m: 0.5, verbose=True)
    for r, record in enumerate(result.history):
        assert record["round"] == r and len(record["participants"]) == 2
        assert record["bytes_sent"] == record["bytes_received"] == 4 * P * 2
        assert record["bytes_sent_total"] == record["bytes_received_total"] == 4 * P * 2 * (r + 1)
        assert record["metric"] == 0.5
    assert result.bytes_sent == result.bytes_received == 4 * P * 2 * 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and "round   3/3" in lines[-1] and "clients 2/4" in lines[-1]
    no_buffers = run_federated(bn_net(), LocalTrainer(X, y, parts), 4, 1, buffers=False,
                               verbose=False)
    assert no_buffers.bytes_sent == 4 * sum(p.numel() for p in model.parameters()) * 4
    assert capsys.readouterr().err == ""


def test_client_ranks():
    assert client_ranks(7, 3, "round_robin").tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert client_ranks(7, 3, "contiguous").tolist() == [1, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="assignment"):
        client_ranks(7, 3, "random")


def load_script():
    spec = importlib.util.spec_from_file_location("deep_federated_round", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
@pytest.mark.parametrize("assignment", ["round_robin", "contiguous"])
def test_mpi_rounds_equal_the_in_process_rounds(tmp_path, assignment):
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([MPIRUN, "-n", "3", sys.executable, SCRIPT, str(out), assignment],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    mpi = json.loads(out.read_text())

    script = load_script()
    model, trainer = script.build()
    local = run_federated(model, trainer, script.N_CLIENTS, script.ROUNDS,
                          client_fraction=script.CLIENT_FRACTION, seed=script.SEED,
                          verbose=False)
    assert np.allclose(np.array(mpi["vector"], dtype=np.float32), local.vector,
                       rtol=0, atol=1e-6)
    assert not np.allclose(local.vector, ParameterVector(script.build()[0]).get())
    for a, b in zip(mpi["history"], local.history):
        for key in ("participants", "n_samples", "bytes_sent", "bytes_received",
                    "bytes_sent_total"):
            assert a[key] == b[key], key
    # per round the header [round, m] (int64), the m participant ids (int64) and the
    # vector (float32) are broadcast to both worker ranks, and after the last round the
    # stop header; each participant's vector and [client, n] (int64) come back
    P = vector_length(model)
    assert mpi["wire_bytes_sent"] == 2 * (sum(16 + 8 * len(h["participants"]) + 4 * P
                                              for h in mpi["history"]) + 16)
    assert mpi["wire_bytes_received"] == sum((4 * P + 16) * len(h["participants"])
                                             for h in mpi["history"])
