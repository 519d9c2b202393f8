// SPDX-License-Identifier: Apache-2.0

// Command gendocs writes magnet's man pages and shell completions from its
// command tree; the Makefile runs it at build time (see internal/clidocs):
//
//	go run ./tools/gendocs -man build/man -completions build/completions -version 1.2.3
//
// The man pages' date is SOURCE_DATE_EPOCH when set (reproducible builds),
// else now.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/magnet-tracer/magnet/internal/cli"
	"github.com/magnet-tracer/magnet/internal/clidocs"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	manDir := flag.String("man", "", "write man pages (section 1) into this directory")
	compDir := flag.String("completions", "", "write bash, zsh and fish completions into this directory")
	version := flag.String("version", cli.Version, "version named in the man pages")
	flag.Parse()
	if flag.NArg() > 0 || (*manDir == "" && *compDir == "") {
		return fmt.Errorf("usage: gendocs [-man DIR] [-completions DIR] [-version V]")
	}
	date := time.Now()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: not a number of seconds", s)
		}
		date = time.Unix(sec, 0)
	}
	cli.Version = *version
	if *manDir != "" {
		if _, err := clidocs.Man(cli.NewRoot(), *manDir, *version, date); err != nil {
			return err
		}
	}
	if *compDir != "" {
		if err := clidocs.Completions(cli.NewRoot(), *compDir); err != nil {
			return err
		}
	}
	return nil
}
