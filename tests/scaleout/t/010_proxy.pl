# pg_idem sharded by key on PL/Proxy: two partition servers and a router.
#
# Through the router, from SQL: the partition map and the hash; the claim
# contract (claim, follower, replay, mismatch, steal, fences, release,
# fail) on the partition that owns each key and on no other; the pieces a
# client must route itself (in-transaction claims, the inbox); a partition
# down fails its own keys with a clear error while the other keeps
# working; and outbox drainers over all partitions lose and duplicate
# nothing, also when a drainer dies holding a batch.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use Scaleout;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my ($router, @parts) = Scaleout::deploy(2, "idem.outbox_backoff = '200ms'");

# SQL on the router.
sub r
{
	return $router->safe_psql('postgres', $_[0]);
}

# SQL on partition $i.
sub p
{
	my ($i, $sql) = @_;
	return $parts[$i]->safe_psql("idem_p$i", $sql);
}

$router->safe_psql('postgres', q{
	CREATE FUNCTION k(label text) RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT sha256(convert_to('tap:' || label, 'UTF8')) $$;
	CREATE FUNCTION h(label text) RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT sha256(convert_to(label, 'UTF8')) $$;
	-- The first label of each partition, for the tests that need one key per partition.
	CREATE FUNCTION label_on(part integer, prefix text) RETURNS text LANGUAGE sql
		AS $$ SELECT prefix || n FROM generate_series(1, 100) n
		       WHERE idem_key_partition(k(prefix || n)) = part ORDER BY n LIMIT 1 $$;
});

### The partition map and the hash.

is(r(q{SELECT string_agg(partition || ':' || partitions || ':' || modular, ',') FROM idem_partition_map()}),
	'0:2:false,1:2:false', 'the map lists both partitions of the SQL/MED server, bitmask mapping');
like(r(q{SELECT conninfo FROM idem_partition_map() WHERE partition = 1}),
	qr/port=${\ $parts[1]->port}/, 'partition 1 is the second server');
is(r(q{SELECT idem_partition_hash('\x01020304ff'::bytea)}), 16909060,
	'the hash is the first 4 bytes, big-endian');
is(r(q{SELECT idem_partition_hash('\xff000000'::bytea)}), -16777216,
	'the hash is a signed int4');
# 4000 SHA-256 keys: each partition gets 50 % +- 4 % (about 5 standard deviations).
my $spread = r(q{
	SELECT string_agg(c::text, ',' ORDER BY part) FROM (
		SELECT idem_key_partition(idem_key('u', 'POST', '/p', 'key-' || n)) AS part, count(*) AS c
		  FROM generate_series(1, 4000) n GROUP BY 1) s});
my @counts = split /,/, $spread;
ok(@counts == 2 && $counts[0] > 1840 && $counts[1] > 1840, "4000 keys spread evenly: $spread");
is(r(q{SELECT encode(idem_key('u', 'POST', '/p', 'k1'), 'hex')}),
	p(1, q{SELECT encode(idem_key('u', 'POST', '/p', 'k1'), 'hex')}),
	'idem_key through the router is the partitions\' idem_key');

### The claim contract through the proxy, on the owning partition only.

my @labels = (r(q{SELECT label_on(0, 'c')}), r(q{SELECT label_on(1, 'c')}));
for my $part (0, 1)
{
	my $l = $labels[$part];
	my $other = 1 - $part;
	my ($outcome, $claim_id, $gen) = split /\|/,
		r(qq{SELECT outcome, claim_id, generation FROM idem_claim(k('$l'), h('$l'), '1h')});
	is($outcome, 'claimed', "p$part: the first claim wins");
	is(p($part, qq{SELECT state || '/' || generation FROM idem_keys
	                WHERE cache_key = sha256(convert_to('tap:$l', 'UTF8'))}),
		"pending/$gen", "p$part: the key is on its partition");
	is(p($other, qq{SELECT count(*) FROM idem_keys WHERE cache_key = sha256(convert_to('tap:$l', 'UTF8'))}),
		0, "p$part: and not on the other");

	is(r(qq{SELECT outcome || '/' || (claim_id IS NULL) || '/' || (retry_after > '0')
	          FROM idem_claim(k('$l'), h('$l'))}),
		'in_progress/true/true', "p$part: a follower sees in_progress, no claim id");
	is(r(qq{SELECT outcome FROM idem_claim(k('$l'), h('other body'))}),
		'mismatch', "p$part: another body is a mismatch");
	ok(r(qq{SELECT idem_renew(k('$l'), '$claim_id', '1h') > now() + '50 minutes'}) eq 't',
		"p$part: the owner renews");
	is(r(qq{SELECT idem_renew(k('$l'), gen_random_uuid())}), '',
		"p$part: a forged claim id renews nothing");
	is(r(qq{SELECT idem_finalize(k('$l'), '$claim_id', 201, '{"content-type": "text/plain"}',
	                             convert_to('paid $l', 'UTF8'))}),
		't', "p$part: the owner finalizes");
	is(r(qq{SELECT outcome || '/' || response_status || '/' || convert_from(response_body, 'UTF8')
	          FROM idem_claim(k('$l'), h('$l'))}),
		"replay/201/paid $l", "p$part: a retry replays the response");
	is(r(qq{SELECT outcome FROM idem_lookup(k('$l'), h('$l'))}), 'replay', "p$part: lookup replays");
	is(r(qq{SELECT idem_finalize(k('$l'), '$claim_id', 500, NULL, NULL)}), 'f',
		"p$part: a second finalize changes nothing");
}

# Steal: an expired lease is taken over by the same request; the old owner
# is fenced out on every write, and a strict finalize raises IL001 through
# the proxy.
{
	my $l = 'steal';
	my ($c1, $g1) = split /\|/, r(qq{SELECT claim_id, generation FROM idem_claim(k('$l'), h('$l'), '100ms')});
	usleep(300_000);
	is(r(qq{SELECT outcome FROM idem_claim(k('$l'), h('other'))}), 'mismatch',
		'steal: another body never steals a crashed winner\'s key');
	my ($o2, $c2, $g2) = split /\|/,
		r(qq{SELECT outcome, claim_id, generation FROM idem_claim(k('$l'), h('$l'), '1h')});
	is($o2, 'recovered_abandoned', 'steal: the same request recovers the expired key');
	ok($g2 > $g1, "steal: the generation grows ($g1 -> $g2)");
	is(r(qq{SELECT idem_renew(k('$l'), '$c1')}), '', 'steal: the old owner cannot renew');
	is(r(qq{SELECT idem_release(k('$l'), '$c1')}), 'f', 'steal: nor release');
	is(r(qq{SELECT idem_fail(k('$l'), '$c1')}), 'f', 'steal: nor fail');
	my ($rc, $out, $err) = $router->psql('postgres', qq{
		\\set VERBOSITY verbose
		SELECT idem_finalize(k('$l'), '$c1', 201, NULL, NULL, strict => true)});
	like($err, qr/IL001/, 'steal: a strict finalize of the old owner raises IL001 through the proxy');
	is(r(qq{SELECT idem_finalize(k('$l'), '$c2', 201, NULL, 'ok')}), 't', 'steal: the new owner finalizes');
}

# Release and fail.
{
	my $l = 'release';
	my ($c, $g) = split /\|/, r(qq{SELECT claim_id, generation FROM idem_claim(k('$l'), h('$l'))});
	is(r(qq{SELECT idem_release(k('$l'), '$c')}), 't', 'release: the owner gives the key up');
	my ($o, $g2) = split /\|/, r(qq{SELECT outcome, generation FROM idem_claim(k('$l'), h('another'))});
	is($o, 'claimed', 'release: any request claims the key again');
	ok($g2 > $g, 'release: with a greater generation');

	$l = 'fail';
	($c) = split /\|/, r(qq{SELECT claim_id FROM idem_claim(k('$l'), h('$l'))});
	is(r(qq{SELECT idem_fail(k('$l'), '$c', '1h')}), 't', 'fail: the owner records a failure');
	is(r(qq{SELECT outcome FROM idem_claim(k('$l'), h('$l'))}), 'cooldown', 'fail: a retry cools down');
}

# Bad input: pg_idem's own errors come back through the proxy.
{
	my ($rc, $out, $err) = $router->psql('postgres',
		q{\set VERBOSITY verbose
		  SELECT idem_claim('\x0102'::bytea, h('x'))});
	like($err, qr/22023/, 'a short key: the partition\'s 22023');
	($rc, $out, $err) = $router->psql('postgres',
		q{\set VERBOSITY verbose
		  SELECT idem_claim(NULL, h('x'))});
	like($err, qr/22004/, 'a NULL key: the partition\'s 22004');
}

### What a client routes itself: in-transaction claims and the inbox.

# In-transaction mode on the owning partition: claim, handler write and
# finalize commit together there.
{
	my $l = 'intx';
	my $part = r(qq{SELECT idem_key_partition(k('$l'))});
	my $key = "sha256(convert_to('tap:$l', 'UTF8'))";
	p($part, qq{
		CREATE TABLE IF NOT EXISTS payments (label text, generation bigint);
		BEGIN;
		WITH c AS (SELECT * FROM idem_begin($key, sha256(convert_to('$l', 'UTF8'))))
		INSERT INTO payments SELECT '$l', generation FROM c;
		SELECT idem_finalize($key, (SELECT claim_id FROM idem_keys WHERE cache_key = $key), 201, NULL, 'ok');
		COMMIT;
	});
	is(r(qq{SELECT outcome FROM idem_lookup(k('$l'), h('$l'))}), 'replay',
		'in-transaction on the routed partition: the router sees the replay');
	is(p($part, qq{SELECT count(*) FROM payments WHERE label = '$l'}), 1,
		'in-transaction: the handler\'s write is on the same partition');
}

# The inbox: a consumer routes each message by consumer + message id.
{
	my $part = r(q{SELECT idem_inbox_partition('billing', 'm-1')});
	my $hash = q{sha256(convert_to('payload', 'UTF8'))};
	is(p($part, qq{BEGIN; SELECT idem_inbox_begin('billing', 'm-1', $hash);
	               SELECT 'done' FROM idem_inbox_done('billing', 'm-1'); COMMIT;}),
		"process\ndone", 'inbox: the first delivery processes on the routed partition');
	is(p($part, qq{BEGIN; SELECT idem_inbox_begin('billing', 'm-1', $hash); COMMIT;}),
		'duplicate', 'inbox: a redelivery routed the same way is a duplicate');
}

# Attempts: by target; a kind is registered on every partition.
{
	is(r(q{SELECT idem_attempt_register_kind('avatar', 'replace', 'avatars')}), 't',
		'attempts: the kind is registered on every partition');
	is(p(0, q{SELECT count(*) FROM idem_attempt_kinds}) . p(1, q{SELECT count(*) FROM idem_attempt_kinds}),
		'11', 'attempts: on both');
	my $part = r(q{SELECT idem_attempt_partition('user-7')});
	is(r(q{SELECT decision FROM idem_attempt_open('avatar', 'user-7', 'r1', 'alice', '{"w": 1}')}), 'new',
		'attempts: opened through the proxy');
	is(p($part, q{SELECT count(*) FROM idem_attempts WHERE target = 'user-7'}), 1,
		'attempts: on the target\'s partition');
}

### A partition down: its keys fail with a clear error, the others work.

{
	my @l = (r(q{SELECT label_on(0, 'down')}), r(q{SELECT label_on(1, 'down')}));
	$parts[1]->stop('immediate');
	is(r(qq{SELECT outcome FROM idem_claim(k('$l[0]'), h('$l[0]'))}), 'claimed',
		'partition 1 down: a key of partition 0 is claimed');
	my ($rc, $out, $err) = $router->psql('postgres', qq{SELECT outcome FROM idem_claim(k('$l[1]'), h('$l[1]'))});
	isnt($rc, 0, 'partition 1 down: a key of partition 1 fails');
	note("the error: $err");
	like($err, qr/PL\/Proxy function public\.idem_claim.*\[idem_p1\].*connection/si,
		'partition 1 down: the error names the function and the partition\'s database');
	is(r(qq{SELECT outcome FROM idem_claim(k('$l[0]'), h('$l[0]'))}), 'in_progress',
		'partition 1 down: partition 0 keeps working');
	$parts[1]->start;
	is(r(qq{SELECT outcome FROM idem_claim(k('$l[1]'), h('$l[1]'))}), 'claimed',
		'partition 1 back: its keys work again');
}

### Outbox drainers over all partitions: nothing lost, nothing twice.

# 120 events through the router: 60 with 6 keys (routed by key, so each
# key's events stay on one partition and in order), 60 keyless (random).
r(q{SELECT idem_outbox_stage('t', jsonb_build_object('n', n), CASE WHEN n % 2 = 0 THEN 'key-' || (n % 12) END)
      FROM generate_series(1, 120) n});
my $split = p(0, q{SELECT count(*) FROM idem_outbox}) . '/' . p(1, q{SELECT count(*) FROM idem_outbox});
ok(p(0, q{SELECT count(*) FROM idem_outbox}) > 20 && p(1, q{SELECT count(*) FROM idem_outbox}) > 20,
	"outbox: events on both partitions ($split)");
is(p(0, q{SELECT count(*) FROM idem_outbox o0 WHERE message_key IS NOT NULL})
	+ p(1, q{SELECT count(*) FROM idem_outbox o1 WHERE message_key IS NOT NULL}), 60,
	'outbox: every keyed event staged once');
is(r(q{SELECT count(DISTINCT idem_partition_text_hash('key-' || n) & 1) FROM generate_series(0, 10, 2) n}), 2,
	'outbox: the keys map to both partitions');

# The drainer: claim from one partition (or from all), record what it
# publishes, ack, and insist that every ack counts what it claimed.
r(q{
	CREATE TABLE published (seq bigserial, n integer, key text, token uuid);
	CREATE FUNCTION drain(part integer, batch integer) RETURNS integer LANGUAGE plpgsql AS $$
	DECLARE
		b record;
		acked integer;
		got integer := 0;
	BEGIN
		CREATE TEMP TABLE IF NOT EXISTS batch_rows (id bigint, key text, payload jsonb, claim_token uuid);
		TRUNCATE batch_rows;
		IF part IS NULL THEN
			INSERT INTO batch_rows SELECT c.id, c.key, c.payload, c.claim_token FROM idem_outbox_claim(batch, '30s') c;
		ELSE
			INSERT INTO batch_rows SELECT c.id, c.key, c.payload, c.claim_token FROM idem_outbox_claim_on(part, batch, '30s') c;
		END IF;
		FOR b IN SELECT claim_token, array_agg(id) AS ids, count(*) AS c FROM batch_rows GROUP BY claim_token LOOP
			INSERT INTO published (n, key, token)
			SELECT (payload->>'n')::integer, key, claim_token FROM batch_rows
			 WHERE claim_token = b.claim_token ORDER BY id;
			IF part IS NULL THEN
				acked := idem_outbox_ack(b.claim_token, b.ids);
			ELSE
				acked := idem_outbox_ack_on(part, b.claim_token, b.ids);
			END IF;
			IF acked <> b.c THEN
				RAISE EXCEPTION 'acked % of % events of token %', acked, b.c, b.claim_token;
			END IF;
			got := got + b.c;
		END LOOP;
		RETURN got;
	END $$;
});

# A drainer that dies holding a batch: 5 events of partition 0 on a 1 s lease.
my $dead_token = r(q{SELECT DISTINCT claim_token FROM idem_outbox_claim_on(0, 5, '1 second')});
# A nack through the all-partitions path: a claim from all partitions
# holds one event of each; both nacks find their partition, and the
# events come back after the backoff.
is(r(q{SELECT string_agg(n.outcome, ',') FROM idem_outbox_claim(1) c,
                LATERAL idem_outbox_nack(c.claim_token, c.id, 'broker down') n}), 'retry,retry',
	'outbox: a claim from all partitions holds one event of each; each nack finds its partition');

# Four drainers at once: per partition, and over all partitions.
my $script = $router->basedir . '/drain.sql';
append_to_file($script, "\\set part random(0, 2)\nSELECT drain(NULLIF(:part, 2), 7);\n");
$router->command_ok(
	[ 'pgbench', '-n', '-c', '4', '-t', '12', '-f', $script, '-h', $router->host, '-p', $router->port, 'postgres' ],
	'outbox: four concurrent drainers run without an error (every ack counted its batch)');
# Then drain what is left, after the dead drainer's lease and the nack's backoff.
usleep(1_200_000);
# Drain until all 120 are published, under a generous deadline rather than
# a fixed number of rounds (the backoff may end late on a busy machine).
my $drain_deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
while (time() < $drain_deadline)
{
	my $got = r(q{SELECT drain(NULL, 50)});
	last if $got == 0 && r(q{SELECT count(*) FROM published}) == 120;
	usleep(100_000) if $got == 0;
}
is(r(q{SELECT count(*) || '/' || count(DISTINCT n) FROM published}), '120/120',
	'outbox: every event published exactly once');
is(p(0, q{SELECT count(*) FROM idem_outbox WHERE state <> 'published'})
	+ p(1, q{SELECT count(*) FROM idem_outbox WHERE state <> 'published'}), 0,
	'outbox: and acked on its partition')
  or diag(p(0, q{SELECT id, message_key, state, attempts, available_at - now(), claim_token FROM idem_outbox WHERE state <> 'published'}), "\n",
          p(1, q{SELECT id, message_key, state, attempts, available_at - now(), claim_token FROM idem_outbox WHERE state <> 'published'}), "\n",
          p(0, q{SHOW idem.outbox_backoff}));
is(r(q{SELECT count(*) FROM (SELECT key, n, lag(n) OVER (PARTITION BY key ORDER BY seq) AS prev
                               FROM published WHERE key IS NOT NULL) s WHERE n < prev}), 0,
	'outbox: each key\'s events published in order');
is(r(qq{SELECT idem_outbox_ack_on(0, '$dead_token', ARRAY(SELECT generate_series(1, 1000)::bigint))}), 0,
	'outbox: the dead drainer\'s late ack changes nothing');

done_testing();
