# SPDX-License-Identifier: Apache-2.0
# Build, install and package magnet. Building needs Go only: the BPF object
# is committed (internal/probe; `go generate ./internal/probe` remakes it).
#
#   make                   static binary, man pages and completions in build/;
#                          also build/magnet-lab, the measurement lab (lab/),
#                          which is neither installed nor packaged
#   sudo make install      into /usr/local; PREFIX=/usr, DESTDIR=/stage honoured
#                          (after `make`, it only copies: root needs no Go)
#   sudo make uninstall    the same files (edited configuration is kept)
#   make deb               build/magnet_VERSION_ARCH.deb, with nfpm
#
# Man pages and completions come from the command tree of this build
# (tools/gendocs), so every subcommand the binary has gets its page.

PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
DATADIR     ?= $(PREFIX)/share
MANDIR      ?= $(DATADIR)/man
# Configuration lives in /etc/magnet whatever the prefix: the units name it.
SYSCONFDIR  ?= /etc
# systemd reads units from /usr/local/lib/systemd/system as well as /usr/lib.
UNITDIR     ?= $(PREFIX)/lib/systemd/system
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
ZSHCOMPDIR  ?= $(DATADIR)/zsh/site-functions
FISHCOMPDIR ?= $(DATADIR)/fish/vendor_completions.d
DESTDIR     ?=

GO       ?= go
BUILDDIR ?= build
GOARCH   ?= $(shell $(GO) env GOARCH)
# nfpm, pinned. v2.46 and later need go.digitalxero.dev modules that the Go
# module proxy reachable here refuses (403), so 2.45.2 is the newest usable.
NFPM     ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2

# Dates in man pages and packages come from the last commit: the same source
# builds the same files.
ifndef SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH := $(shell git log -1 --format=%ct 2>/dev/null || date +%s)
endif
export SOURCE_DATE_EPOCH
# A release tag v1.2.3 gives 1.2.3; otherwise 0.0.0~gitDATE.COMMIT, which
# Debian sorts before any release.
# Where git cannot tell (no repository; or root under sudo, to whom git
# refuses another user's repository), the version of the last build stands.
ifndef VERSION
VERSION := $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null) && echo "$$v" | sed 's/^v//' || \
	{ c=$$(git rev-parse --short HEAD 2>/dev/null) && echo 0.0.0~git$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y%m%d).$$c; } || \
	cat $(BUILDDIR)/version 2>/dev/null || echo 0.0.0~dev)
endif

BIN     := $(BUILDDIR)/magnet
LAB     := $(BUILDDIR)/magnet-lab
MAN     := $(BUILDDIR)/man/magnet.1.gz
LDFLAGS := -s -w -X github.com/magnet-tracer/magnet/internal/cli.Version=$(VERSION)
UNITS   := magnet-collect.service magnetd.service
CONFIGS := collect.yaml magnetd.yaml
STAGE   := $(BUILDDIR)/deb-root
# Everything go build reads (the BPF object is embedded from internal/probe).
SOURCES := $(shell find cmd internal tools -type f ! -name '*_test.go') go.mod go.sum
LABSOURCES := $(SOURCES) $(shell find lab -type f ! -name '*_test.go')

.PHONY: all build lab docs install uninstall deb clean FORCE

all: build lab docs
build: $(BIN)
lab: $(LAB)
docs: $(MAN)

# Rewritten only when the version changes, so that a new version relinks.
$(BUILDDIR)/version: FORCE
	@mkdir -p $(@D)
	@echo '$(VERSION)' | cmp -s - $@ || echo '$(VERSION)' >$@

$(BIN): $(SOURCES) $(BUILDDIR)/version
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/magnet
	@$(GO) version -m $@ | grep -q 'CGO_ENABLED=0' || { echo "$@: not a static build (CGO_ENABLED=0)" >&2; exit 1; }

$(LAB): $(LABSOURCES) $(BUILDDIR)/version
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./lab/cmd/magnet-lab

# From the same tree as the binary, whenever it changes; regenerated whole,
# so a removed command leaves no stale page behind.
$(MAN): $(BIN)
	rm -rf $(BUILDDIR)/man $(BUILDDIR)/completions
	$(GO) run ./tools/gendocs -version '$(VERSION)' -man $(BUILDDIR)/man -completions $(BUILDDIR)/completions
	gzip -9nf $(BUILDDIR)/man/*.1

install: build docs
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/magnet \
		$(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	install -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/magnet
	install -m 0644 $(BUILDDIR)/man/*.1.gz $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(BUILDDIR)/completions/magnet.bash $(DESTDIR)$(BASHCOMPDIR)/magnet
	install -m 0644 $(BUILDDIR)/completions/_magnet $(DESTDIR)$(ZSHCOMPDIR)/_magnet
	install -m 0644 $(BUILDDIR)/completions/magnet.fish $(DESTDIR)$(FISHCOMPDIR)/magnet.fish
	@# The units name the installed binary and configuration.
	for u in $(UNITS); do \
		sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' deploy/systemd/$$u.in >$(DESTDIR)$(UNITDIR)/$$u && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done
	@# An existing configuration is the administrator's: never overwritten.
	for c in $(CONFIGS); do \
		dst=$(DESTDIR)$(SYSCONFDIR)/magnet/$$c; \
		if [ -e $$dst ]; then echo "kept $$dst (the default is deploy/config/$$c)"; \
		else install -m 0644 deploy/config/$$c $$dst || exit 1; fi; \
	done
	@[ -n "$(DESTDIR)" ] || echo "installed; then: systemctl daemon-reload && systemctl enable --now magnet-collect"

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/magnet $(DESTDIR)$(MANDIR)/man1/magnet.1.gz $(DESTDIR)$(MANDIR)/man1/magnet-*.1.gz \
		$(DESTDIR)$(BASHCOMPDIR)/magnet $(DESTDIR)$(ZSHCOMPDIR)/_magnet $(DESTDIR)$(FISHCOMPDIR)/magnet.fish
	for u in $(UNITS); do rm -f $(DESTDIR)$(UNITDIR)/$$u; done
	@# Configuration goes only if it is still the default.
	for c in $(CONFIGS); do \
		dst=$(DESTDIR)$(SYSCONFDIR)/magnet/$$c; \
		if cmp -s deploy/config/$$c $$dst; then rm -f $$dst; \
		elif [ -e $$dst ]; then echo "kept $$dst (edited)"; fi; \
	done
	rmdir $(DESTDIR)$(SYSCONFDIR)/magnet 2>/dev/null || true

# The package is `make install` with PREFIX=/usr, staged and handed to nfpm
# (deploy/nfpm.yaml).
deb:
	rm -rf $(STAGE)
	$(MAKE) install DESTDIR=$(abspath $(STAGE)) PREFIX=/usr UNITDIR=/usr/lib/systemd/system \
		ZSHCOMPDIR=/usr/share/zsh/vendor-completions BUILDDIR=$(BUILDDIR) VERSION='$(VERSION)'
	STAGE=$(abspath $(STAGE)) VERSION='$(VERSION)' GOARCH=$(GOARCH) \
		$(NFPM) package --config deploy/nfpm.yaml --packager deb --target $(BUILDDIR)/

clean:
	rm -rf $(BUILDDIR)

FORCE:
