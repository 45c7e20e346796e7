package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kiln-ml/kiln/manifest"
	"github.com/kiln-ml/kiln/pack"
)

type packOptions struct {
	cfg         pack.Config
	to          []string
	from        []string
	compression string
	insecure    bool
	format      string
	gcs         pack.GCS
	dryRun      bool
	progress    string
}

func (o *packOptions) addFlags(f *pflag.FlagSet) {
	f.StringArrayVar(&o.to, "to", nil, "`DEST` to publish to: dir:PATH, oci-layout:PATH[:TAG], oci-archive:FILE.tar[:TAG], image:REF or gs://BUCKET/PREFIX; repeatable")
	f.StringArrayVar(&o.from, "from", nil, "read a repository back from `SRC` (image:REF, oci-layout:PATH[:TAG], gs://BUCKET/PREFIX or dir:PATH) into the dir: destination, instead of publishing REPO; repeatable: the sources' models merge into one repository")
	f.StringVar(&o.cfg.Base, "base", pack.DefaultBase, "base `IMAGE` of image destinations; scratch: a model-only image (KServe modelcar)")
	choice(f, &o.compression, "compression", string(pack.Gzip), "compression of the repository layer", string(pack.Gzip), string(pack.Zstd))
	trtVersionFlag(f, &o.cfg.Target.TRT, "refuse TensorRT plans not built with this TensorRT release (10.3 matches any 10.3.x)")
	computeCapabilityFlag(f, &o.cfg.Target.ComputeCapability, "refuse TensorRT plans not built for this GPU architecture (8.9 or sm89)")
	f.BoolVar(&o.cfg.AllowUnchecked, "allow-unchecked", false, "publish models kiln serve has not passed (a failed verdict is refused all the same)")
	f.BoolVar(&o.insecure, "insecure", false, "reach registries over plain http")
	f.IntVar(&o.gcs.Jobs, "jobs", pack.DefaultJobs, "gs://: objects uploaded or downloaded at once")
	sizeFlag(f, &o.gcs.ChunkSize, "chunk-size", pack.DefaultChunkSize, "gs://: chunk of resumable uploads, held in memory per job and sent again after a dropped connection")
	f.BoolVar(&o.gcs.Delete, "delete", false, "gs://: remove objects under the prefix that the repository does not hold")
	f.BoolVar(&o.dryRun, "dry-run", false, "gs://: print the objects that would be uploaded or deleted, and write nothing")
	progressFlag(f, &o.progress)
	formatFlag(f, &o.format)
}

func newPackCmd(g *globalOptions) *cobra.Command {
	o := &packOptions{}
	c := &cobra.Command{
		Use:   "pack REPO --to DEST... | pack --from SRC... --to dir:PATH",
		Short: "Publish a repository to directories, OCI layouts and registries, verified",
		Long: `pack publishes one model repository to every --to destination in one run and
checks what arrived against kiln.json: a directory copy file by file, an OCI
layout, archive or pushed image by its manifest digest. Image destinations
get a Triton base image plus one layer holding the repository under /models
(entrypoint tritonserver --model-repository=/models, ports 8000-8002), or
with --base scratch a model-only image; the same repository always gives the
same digest. Before anything is written, pack refuses TensorRT plans built
for another TensorRT release or GPU than --trt-version, --compute-capability
or the base image, and models kiln serve has not passed (exit 3).
A gs:// destination gets one object per file under the prefix, uploaded in
parallel (--jobs) with CRC32C checked; objects already there with the same
size and CRC32C are not sent again, and kiln.json is removed first and
written last, so a prefix holding kiln.json holds a complete repository.
With --from it reads a repository back from an image, OCI layout or gs://,
verified, into --to dir:PATH. Given several times, it merges the sources
into one repository with one kiln.json: a model one source holds keeps its
records (source, build, checks); a model several hold is kept once when its
files are the same in each (a record without files, a variant a machine
could not build, gives way to one with files) and is an error naming the
model and file when they differ. Naming the target among the sources
(--from dir:PATH) adds to it. The target is replaced only once everything
is read and checked.`,
		Example: `  kiln pack models --to dir:/srv/models
  kiln pack models --to image:us-docker.pkg.dev/proj/repo/resnet:1 --trt-version 10.3 --compute-capability sm89
  kiln pack models --to oci-archive:models.tar --base scratch
  kiln pack models --to gs://my-bucket/models/resnet --jobs 8 --delete
  kiln pack models --to gs://my-bucket/models/resnet --dry-run
  kiln pack --from image:registry.local/resnet:1 --to dir:restored
  kiln pack --from gs://my-bucket/models/resnet --to dir:restored
  kiln pack --from gs://my-bucket/cache/onnx-fp16 --from gs://my-bucket/cache/trt-fp16-sm89 --to dir:assembled`,
		Args: argsUsage(cobra.MaximumNArgs(1)),
		RunE: func(c *cobra.Command, args []string) error {
			return o.run(c, g, args)
		},
	}
	o.addFlags(c.Flags())
	return c
}

func (o *packOptions) run(c *cobra.Command, g *globalOptions, args []string) error {
	for _, s := range o.to {
		d, err := pack.ParseDestination(s)
		if err != nil {
			return usageErr(fmt.Errorf("--to: %w", err))
		}
		o.cfg.To = append(o.cfg.To, d)
	}
	if len(o.cfg.To) == 0 {
		return usageErr(errors.New("give at least one --to destination"))
	}
	if o.gcs.Jobs < 1 {
		return usageErr(fmt.Errorf("--jobs %d: want at least 1", o.gcs.Jobs))
	}
	report, endProgress := newProgress(c.ErrOrStderr(), o.progress)
	defer endProgress()
	o.gcs.Progress = report
	opts := []pack.Option{pack.WithLogger(g.logger(c.ErrOrStderr())), pack.WithRegistry(pack.DefaultRegistry(o.insecure)), pack.WithGCS(o.gcs)}
	if len(o.from) > 0 {
		return o.pull(c, args, opts)
	}
	if len(args) != 1 {
		return usageErr(errors.New("give the repository to publish (kiln pack REPO --to DEST), or --from SRC"))
	}
	o.cfg.Repo = args[0]
	o.cfg.Compression = pack.Compression(o.compression)
	if o.cfg.Base == "" {
		return usageErr(errors.New("--base: give an image reference or scratch"))
	}
	if o.dryRun {
		return o.dryRunGCS(c, opts)
	}
	pubs, err := pack.Run(c.Context(), o.cfg, opts...)
	var re *pack.RefusedError
	if errors.As(err, &re) {
		return &ExitError{Code: ExitCheck, Err: err}
	}
	if perr := o.print(c.OutOrStdout(), pubs); perr != nil && err == nil {
		err = perr
	}
	return err
}

// print writes what arrived: "DEST<TAB>DIGEST" lines, or with --format
// json {"published": [{destination, digest, time}]}, the records kiln.json
// keeps.
func (o *packOptions) print(w io.Writer, pubs []pack.Publication) error {
	if o.format == formatJSON {
		if pubs == nil {
			pubs = []pack.Publication{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"published": pubs})
	}
	for _, p := range pubs {
		if _, err := fmt.Fprintf(w, "%s\t%s\n", p.Destination, p.Digest); err != nil {
			return err
		}
	}
	return nil
}

// pull reads the repositories of --from into the one dir: destination,
// merging them when there are several: "SRC<TAB>DEST<TAB>DIGEST" lines.
func (o *packOptions) pull(c *cobra.Command, args []string, opts []pack.Option) error {
	var srcs []pack.Destination
	for _, s := range o.from {
		src, err := pack.ParseDestination(s)
		if err != nil {
			return usageErr(fmt.Errorf("--from: %w", err))
		}
		srcs = append(srcs, src)
	}
	if len(args) != 0 || len(o.cfg.To) != 1 || o.cfg.To[0].Kind != pack.KindDir {
		return usageErr(errors.New("--from reads into one --to dir:PATH and takes no REPO"))
	}
	var digests []manifest.Digest
	var err error
	if len(srcs) == 1 && srcs[0].Kind != pack.KindDir {
		var d manifest.Digest
		d, err = pack.Pull(c.Context(), srcs[0], o.cfg.To[0].Path, opts...)
		digests = []manifest.Digest{d}
	} else {
		digests, err = pack.Merge(c.Context(), srcs, o.cfg.To[0].Path, opts...)
	}
	var ce *pack.CollisionError
	if errors.As(err, &ce) {
		return &ExitError{Code: ExitCheck, Err: err}
	}
	if err != nil {
		return err
	}
	for i, src := range srcs {
		if _, err := fmt.Fprintf(c.OutOrStdout(), "%s\t%s\t%s\n", src, o.cfg.To[0], digests[i]); err != nil {
			return err
		}
	}
	return nil
}

// dryRunGCS prints what publishing to the gs:// destinations would upload
// and delete: "OP<TAB>OBJECT<TAB>BYTES" lines, or with --format json
// {"changes": [{op, object, size}]}.
func (o *packOptions) dryRunGCS(c *cobra.Command, opts []pack.Option) error {
	for _, d := range o.cfg.To {
		if d.Kind != pack.KindGCS {
			return usageErr(fmt.Errorf("--dry-run: %s is not a gs:// destination", d))
		}
	}
	cs, err := pack.DryRun(c.Context(), o.cfg, opts...)
	var re *pack.RefusedError
	if errors.As(err, &re) {
		return &ExitError{Code: ExitCheck, Err: err}
	}
	if err != nil {
		return err
	}
	w := c.OutOrStdout()
	if o.format == formatJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"changes": cs})
	}
	for _, ch := range cs {
		if _, err := fmt.Fprintf(w, "%s\t%s\t%d\n", ch.Op, ch.Object, ch.Size); err != nil {
			return err
		}
	}
	return nil
}
