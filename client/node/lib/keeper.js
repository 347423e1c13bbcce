'use strict';
// The winner's lease renewal while its handler runs: on a client of the
// pool for each renewal, so that a winner holds no connection while its
// handler runs (the handler may need the pool itself: ten winners holding
// ten clients of a pool of ten, each handler waiting for an eleventh,
// would never finish); or on a client given to it.

// The lock_wait argument: at least a millisecond (the server rounds up to whole ones).
const lockWaitText = (ms) => `${Math.max(1, Math.round(ms))}ms`;
const msText = (ms) => `${Math.max(1, Math.round(ms))} milliseconds`;

// Renews the winner's lease every renewInterval while the handler runs.
class Keeper {
  constructor(runner, client, ck, claimId) {
    Object.assign(this, { runner, client, ck, claimId, lost: false, stopped: false });
    this.timer = null;
    this.pending = Promise.resolve();
    this.schedule(runner.config.renewInterval);
  }

  schedule(ms) {
    if (this.stopped || this.lost) return;
    this.timer = setTimeout(() => {
      this.pending = this.renew();
    }, ms);
  }

  async renew() {
    const cfg = this.runner.config;
    let next = cfg.renewInterval;
    let own = null;
    try {
      const client = this.client || (own = await this.runner.checkout());
      const row = await this.runner.q(client, this.runner.calls.renew,
        [this.ck, this.claimId, msText(cfg.lease), lockWaitText(cfg.renewInterval)]);
      if (!row || !row.ok) {
        this.lost = true; // taken over: stop renewing
        return;
      }
    } catch {
      if (own) own.idemBroken = true; // not reused: its session may be gone
      next = Math.max(1, cfg.renewInterval / 4); // e.g. lock_timeout: sooner, never in a tight loop
    } finally {
      if (own) this.runner.giveBack(own);
    }
    this.schedule(next);
  }

  async stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.pending;
  }
}

module.exports = { Keeper, lockWaitText, msText };
