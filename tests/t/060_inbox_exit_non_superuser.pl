# A consumer that is not a superuser dies mid-attempt: the retry cap still
# holds (a review finding).
#
# The backend records the orphaned attempt on its way out, outside any
# function call: it must do so as idem_inbox_begin ran, as the
# extension's owner.  As the session's own role (an idem_client, which
# may not write idem_inbox) the recording failed with "permission denied",
# the attempt went uncounted, and a message that kills its consumer ran
# past its cap for ever.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The inbox's locks live in shared memory: preloaded, without the cleanup worker.
my $node = IdemTest::new_node('review_exit_role', "shared_preload_libraries = 'pg_idem'",
	'idem.cleanup_worker = off');

$node->safe_psql('postgres', q{
	CREATE ROLE review_consumer LOGIN;
	GRANT idem_client TO review_consumer;
	ALTER ROLE review_consumer SET search_path = "$user";
});

# Run SQL as the superuser and return its result.
sub q1
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# The message's state, error count and last error.
sub message
{
	my ($message_id) = @_;
	return q1(qq{SELECT state || ' ' || error_count || ' ' || coalesce(last_error, '-')
	             FROM idem_inbox WHERE consumer = 'tap' AND message_id = '$message_id'});
}

# A consumer session of review_consumer that begins the message and is
# terminated with its attempt open.
sub killed_attempt
{
	my ($message_id, $max) = @_;
	my $session = $node->background_psql('postgres',
		extra_params => [ '-U', 'review_consumer' ]);
	my $pid = $session->query_safe('SELECT pg_backend_pid()');

	is($session->query_safe('SELECT current_user'), 'review_consumer',
		"$message_id: the consumer is an idem_client role");
	$session->query_safe('BEGIN');
	is( $session->query_safe(
			"SELECT public.idem_inbox_begin('tap', '$message_id', sha256('payload'), $max)"),
		'process', "$message_id: the consumer begins an attempt");
	is(q1("SELECT pg_terminate_backend($pid)"), 't', "$message_id: consumer terminated");
	ok( $node->poll_query_until('postgres', qq{
			SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid}),
		"$message_id: its backend is gone");
	eval { $session->quit };
}

my $log_offset = -s $node->logfile;

killed_attempt('m-role', 2);
is(message('m-role'), 'failed 1 consumer session ended during the attempt',
	'm-role: the killed attempt is counted');

killed_attempt('m-role', 2);
is(message('m-role'), 'dead 2 consumer session ended during the attempt',
	'm-role: the second killed attempt reaches the cap: dead');
is(q1(q{SELECT count(*) FROM idem_outbox WHERE topic = 'idem.inbox.dead'
                                         AND payload->>'message_id' = 'm-role'}),
	'1', 'm-role: one dead letter staged');

my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/permission denied for table idem_inbox/,
	'no permission error while recording on exit');

$node->stop;
done_testing();
