"""verl.utils.offload: storages emptied and restored in place, views kept valid, optimizer state found."""

from __future__ import annotations

import torch

from verl.utils.offload import Away, offload, optimizer_state_tensors


def test_views_of_one_buffer_leave_and_come_back_bitwise():
    buf = torch.randn(100)
    a, b = buf[:40].view(4, 10), buf[40:]  # as megatron's parameters are views of one buffer
    want = buf.clone()
    away = offload([a, b, None, torch.empty(0)])
    assert away.nbytes == 400  # the shared storage counted once; the empty one skipped
    assert buf.untyped_storage().nbytes() == 0 and a.shape == (4, 10)
    away.restore()
    assert torch.equal(buf, want) and torch.equal(a, want[:40].view(4, 10)) and torch.equal(b, want[40:])
    away.restore()  # nothing away: a no-op
    assert torch.equal(buf, want)


def test_away_moves_adam_state_but_not_the_parameters_it_skips():
    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = [t.clone() for t in optimizer_state_tensors(opt)]
    assert len(state) == 6  # step, exp_avg, exp_avg_sq per parameter
    params = [p.detach().clone() for p in lin.parameters()]
    moved = Away(
        lambda: [*optimizer_state_tensors(opt), *lin.parameters()], enabled=True, skip=lambda: lin.parameters()
    )
    moved.release()
    assert moved.released_bytes == sum(t.untyped_storage().nbytes() for t in state)
    assert all(t.untyped_storage().nbytes() == 0 for t in optimizer_state_tensors(opt))
    assert all(torch.equal(p, q) for p, q in zip(lin.parameters(), params))
    moved.release()  # already away: nothing more to move
    with moved.back():  # on the device for the block, then away again
        assert all(torch.equal(t, s) for t, s in zip(optimizer_state_tensors(opt), state))
        opt.step()  # the optimizer steps on with its state back
    assert all(t.untyped_storage().nbytes() == 0 for t in optimizer_state_tensors(opt))
    moved.resident()
    assert all(not torch.equal(t, s) for t, s in zip(optimizer_state_tensors(opt)[1:3], state[1:3]))  # it stepped


def test_disabled_does_nothing_and_dropped_content_gets_its_room_back():
    t = torch.ones(8)
    Away(lambda: [t], enabled=False).release()
    assert torch.equal(t, torch.ones(8))
    dropped = Away(lambda: [t], enabled=True, keep=False)
    dropped.release()
    assert t.untyped_storage().nbytes() == 0
    dropped.resident()
    assert t.untyped_storage().nbytes() == 32 and t.shape == (8,)  # content undefined: a buffer zeroed before use
