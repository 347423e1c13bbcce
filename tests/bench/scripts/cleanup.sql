-- Steady state: what a cron job (or the cleanup worker) runs.
SELECT idem_cleanup(1000);
