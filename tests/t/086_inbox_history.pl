# A randomized history of inbox deliveries (tests/t/inbox_history.py):
# worker processes in two roles deliver a few messages with every outcome
# a consumer can have -- success, failure under the savepoint protocol or
# after a rollback, an attempt left unaccounted for, pg_advisory_unlock_all,
# DISCARD ALL, a client that vanishes, a terminated backend -- under random
# session settings (read-only by default, the inbox backoff at both ends
# of its range).  Then every message is delivered once more, and the
# checker asserts: no message ran more than max_attempts times, each is
# done with one effect and its failed runs counted, or dead exactly at the
# cap, and nothing is stuck.
#
# make test runs a short history; INBOX_HISTORY_STEPS (deliveries, default
# 400), INBOX_HISTORY_WORKERS (default 4) and INBOX_HISTORY_SEED make it
# longer or replay one.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = IdemTest::new_node('inbox_history', "shared_preload_libraries = 'pg_idem'",
	'idem.cleanup_worker = off', 'max_connections = 40');

my $steps = $ENV{INBOX_HISTORY_STEPS} // 400;
my $workers = $ENV{INBOX_HISTORY_WORKERS} // 4;
my @seed = defined $ENV{INBOX_HISTORY_SEED} ? ('--seed', $ENV{INBOX_HISTORY_SEED}) : ();
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ '/usr/bin/python3', "$FindBin::RealBin/inbox_history.py",
	  '--dsn', $node->connstr('postgres'), '--steps', $steps, '--workers', $workers, @seed ],
	'>', \$out, '2>', \$err);
note("history: $out");
note("stderr: $err") if $err ne '';
ok($ok, 'the history holds (inbox_history.py exited 0)');
like($out, qr/"violations": \[\]/, 'no violation');
like($out, qr/"runs": [1-9]/, 'handlers ran');
like($out, qr/"final_deliveries": \{/, 'every message was delivered once more at the end');
# The history exercised what it claims to (with a small history some
# outcome may be missing: at least the main ones).
for my $outcome (qw(ok savepoint_fail rollback_only die))
{
	like($out, qr/"$outcome": [1-9]/, "the history includes $outcome");
}
ok(!$node->log_contains('TRAP|server process .* was terminated by signal'),
	'no backend crashed');
done_testing();
