# pg_idem: PGXS build of the extension, and the project's entry points.
#
#   make            build the extension          make install   install it
#   make test       everything, on a throwaway cluster (tests/run.sh)
#   make demo       the duplicate-request storm against the HTTP example service (tests/demo.sh)
#   make bench      the benchmarks (tests/bench/run.sh)
#   make protocol   regenerate every copy of the protocol from
#                   extension/protocol/protocol.toml (C, the three clients, docs)
#   make sql-edition  the SQL edition for managed PostgreSQL: pg_idem_sql-VERSION.sql
#                   (psql -f) and pg_idem_tle-VERSION.sql (pg_tle), no compiler needed

.DEFAULT_GOAL := all

EXT         = pg_idem
EXTVERSION  = $(shell sed -n "s/^default_version *= *'\(.*\)'.*/\1/p" extension/$(EXT).control)

MODULE_big  = $(EXT)
# One folder per concern (docs/design.md has the file map) and module.c above
# them (_PG_init); every .c is built.
OBJS        = $(patsubst %.c,%.o,$(sort $(wildcard extension/*.c extension/*/*.c)))
PG_CPPFLAGS = -I$(srcdir)/extension -DIDEM_VERSION=\"$(EXTVERSION)\" -DIDEM_PREVIOUS_VERSION=\"$(PREVIOUS)\"
PG_CFLAGS   = -Werror=implicit-function-declaration
# Only idem_* and what PostgreSQL looks up are exported (exports.map).
SHLIB_LINK  = -Wl,--version-script=$(srcdir)/extension/exports.map

# The install script of the current version is assembled from one file per
# concern (extension/install/NN_*.sql, in name order), and the upgrade
# script to it from extension/upgrades/<previous>--<current>/NN_*.sql.
# extension/releases/ keeps, frozen, the install script of the oldest
# version an upgrade starts from and every release step's upgrade script
# since (docs/design.md, Versions and upgrades); tests/t/050_upgrade.pl
# checks that every path ends where a fresh install does.  The library
# serves the previous release's tables until the update (core/schema.c).
MODULEDIR   = extension
PREVIOUS    = 0.5.0
UPGRADE     = $(EXT)--$(PREVIOUS)--$(EXTVERSION).sql
DATA        = extension/$(EXT).control $(wildcard extension/releases/$(EXT)--*.sql)
DATA_built  = $(EXT)--$(EXTVERSION).sql $(UPGRADE)
EXTRA_CLEAN = $(EXT)--*.sql results regression.diffs regression.out \
              output_iso tmp_check $(EXT)_sql-*.sql $(EXT)_tle-*.sql

# Tests are discovered: drop foo.sql + expected/foo.out, or a spec + its
# expected output, or a TAP script in place.
REGRESS      = $(sort $(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=$(EXT)
ISOLATION    = $(sort $(patsubst tests/isolation/specs/%.spec,%,$(wildcard tests/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=tests/isolation --load-extension=$(EXT)
TAP_TESTS    = 1
PROVE_TESTS ?= $(sort $(wildcard tests/t/*.pl))

# assemble: concatenate the prerequisites into $@ behind the psql guard.
define assemble
	{ echo '-- generated from $^: edit those files'; \
	  printf '%s\n' '\echo Use "CREATE EXTENSION $(EXT)" or "ALTER EXTENSION $(EXT) UPDATE" to load this file. \quit'; \
	  for f in $^; do echo; echo "-- $$f"; cat $$f; done; } > $@
endef

$(EXT)--$(EXTVERSION).sql: $(sort $(wildcard extension/install/*.sql))
	$(assemble)

# Three install pieces run in every upgrade too: the writable-schema warning
# (install/00_schema_check.sql) and the preload notice (05_preload_check.sql)
# first, and the privileges loop (90_privileges.sql) last, which locks down
# functions the upgrade created.  An install piece whose objects are all new
# in this version runs in the upgrade as it is (NEW_PIECES), after the
# upgrade's own pieces, instead of a copy of it among them.
NEW_PIECES = extension/install/55_redrive.sql
$(UPGRADE): extension/install/00_schema_check.sql extension/install/05_preload_check.sql $(sort $(wildcard extension/upgrades/$(PREVIOUS)--$(EXTVERSION)/*.sql)) $(NEW_PIECES) extension/install/90_privileges.sql
	$(assemble)

$(OBJS): $(wildcard extension/*/*.h)

# The SQL edition (extension/sql_edition/build.py): the install pieces
# above with every C function given a SQL or PL/pgSQL body.
SQL_EDITION_SOURCES = extension/sql_edition/build.py $(wildcard extension/sql_edition/*.sql) \
                      $(wildcard extension/install/*.sql) extension/protocol/protocol.toml \
                      extension/core/settings.c extension/$(EXT).control
$(EXT)_sql-$(EXTVERSION).sql: $(SQL_EDITION_SOURCES)
	python3 extension/sql_edition/build.py plain $@
$(EXT)_tle-$(EXTVERSION).sql: $(SQL_EDITION_SOURCES)
	python3 extension/sql_edition/build.py tle $@

.PHONY: test demo bench protocol sql-edition
sql-edition: $(EXT)_sql-$(EXTVERSION).sql $(EXT)_tle-$(EXTVERSION).sql
protocol:
	python3 extension/protocol/generate.py
test:
	bash tests/run.sh
demo:
	bash tests/demo.sh
bench:
	bash tests/bench/run.sh $(MODE)

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
