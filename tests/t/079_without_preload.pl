# pg_idem says what running without shared_preload_libraries costs (issue
# 22, item 3): a NOTICE at CREATE EXTENSION and ALTER EXTENSION UPDATE
# (no cleanup worker, no counters, polling waits), and a WARNING once per
# backend from the functions that need the preload (a server-side wait).
# With the preload, neither.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $plain = PostgreSQL::Test::Cluster->new('without_preload');
$plain->init;
$plain->start;
my $preloaded = PostgreSQL::Test::Cluster->new('with_preload');
$preloaded->init;
$preloaded->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_worker = off
});
$preloaded->start;

my $notice = qr/NOTICE:  pg_idem is not loaded via shared_preload_libraries\n.*DETAIL:  Without it no cleanup worker runs/s;
my $warning = qr/WARNING:  pg_idem is not loaded via shared_preload_libraries/;

# stderr of sql on node (psql dies on nothing; the caller checks).
sub stderr_of
{
	my ($node, $db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, $sql, on_error_stop => 1);
	is($rc, 0, "$db: ran: $sql") or diag($err);
	return $err;
}

like(stderr_of($plain, 'postgres', 'CREATE EXTENSION pg_idem'), $notice,
	'without the preload: CREATE EXTENSION says what is missing');
is($plain->safe_psql('postgres', q{SELECT count(*) FROM pg_proc WHERE proname = 'idem_preload_notice'}),
	'0', 'the check leaves no function behind');
$plain->safe_psql('postgres', 'CREATE DATABASE upgraded');
stderr_of($plain, 'upgraded', q{CREATE EXTENSION pg_idem VERSION '0.4.0'});
like(stderr_of($plain, 'upgraded', 'ALTER EXTENSION pg_idem UPDATE'), $notice,
	'without the preload: ALTER EXTENSION UPDATE says it too');

# A follower's server-side wait, twice in one session, then idem_outbox_wait
# in another: one WARNING per backend.
$plain->safe_psql('postgres',
	q{SELECT idem_claim(idem_key('t', 'POST', '/p', 'held'), sha256('b'), '1 hour')});
my $follow = q{SELECT outcome FROM idem_claim(idem_key('t', 'POST', '/p', 'held'), sha256('b'), NULL, '100 ms');};
my $err = stderr_of($plain, 'postgres', "$follow\n$follow");
my @warnings = $err =~ /$warning/g;
is(scalar @warnings, 1, 'without the preload: two waits in one backend warn once')
  or diag($err);
like($err, qr/DETAIL:  Without it no cleanup worker runs/, 'the WARNING says what it costs');
like(stderr_of($plain, 'postgres', q{SELECT idem_outbox_wait('100 ms')}), $warning,
	'without the preload: idem_outbox_wait warns in a new backend');
unlike(stderr_of($plain, 'postgres', q{SELECT idem_claim(idem_key('t', 'POST', '/p', 'new'), sha256('b'))}),
	$warning, 'a claim that does not wait does not warn');

# With the preload: nothing.
my $quiet = stderr_of($preloaded, 'postgres', 'CREATE EXTENSION pg_idem');
unlike($quiet, qr/shared_preload_libraries/, 'with the preload: CREATE EXTENSION says nothing of it');
$preloaded->safe_psql('postgres',
	q{SELECT idem_claim(idem_key('t', 'POST', '/p', 'held'), sha256('b'), '1 hour')});
unlike(stderr_of($preloaded, 'postgres', "$follow\nSELECT idem_outbox_wait('100 ms');"),
	qr/shared_preload_libraries/, 'with the preload: waits do not warn');

$preloaded->stop;
$plain->stop;
done_testing();
