'use strict';
// The winner's lease renewal while its handler runs, on the claim's own
// connection (a renewal never waits for the pool the handler may be using).

const lockTimeoutText = (ms) => `${Math.max(1, Math.round(ms))}ms`; // 0 would mean "wait forever"
const msText = (ms) => `${Math.max(1, Math.round(ms))} milliseconds`;

// Renews the winner's lease every renewInterval on the claim's connection while the handler runs.
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
    try {
      const row = await this.runner.q(this.client, this.runner.sql.renew,
        [lockTimeoutText(cfg.renewInterval), this.ck, this.claimId, msText(cfg.lease)]);
      if (!row || !row.ok) {
        this.lost = true; // taken over: stop renewing
        return;
      }
    } catch {
      next = Math.max(1, cfg.renewInterval / 4); // e.g. lock_timeout: sooner, never in a tight loop
    }
    this.schedule(next);
  }

  async stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.pending;
  }
}

module.exports = { Keeper, lockTimeoutText, msText };
