// `ncf_prep --format tfmg`: TensorFlow Model Garden NCF shards
// (official/recommendation, create_ncf_data.py with int64 features) into a
// dataset directory, keeping TF-MG's positives, eval candidates and duplicate
// masks exactly. The input layout:
//   DIR/meta_data.json                       counts, batch sizes, steps, epochs
//   DIR/training_cycle_<e>/shard_<k>.tfrecords   e = 0 .. num_train_epochs-1
//   DIR/eval_data/shard_<k>.tfrecords        k = 0 .. n-1 (TF-MG writes 16)
// Each record is one TFRecord frame holding one tf.train.Example (data/
// tf_example.proto) that is a whole prebatch: Int64List features user_id,
// item_id, labels, valid_point_mask (training) or user_id, item_id,
// duplicate_mask (eval: users of 1 + E candidates, the true item last).
#pragma once

#include <string>

#include "data/dataset.h"
#include "data/sources.h"

namespace ncf {

// Which training cycles prepare_tfmg decodes. Every cycle holds the same
// positives with fresh negatives; kAll reads them all and checks that, kFirst
// reads cycle 0 and only checks that the others' shard files exist.
enum class TfmgCycles { kAll, kFirst };

// "all" or "first"; throws naming the value otherwise.
TfmgCycles parse_tfmg_cycles(const std::string& name);

// True when `path` is a directory holding meta_data.json and training_cycle_0/:
// what `ncf_prep --input DIR` (format auto) takes for TF-MG shards.
bool is_tfmg_dir(const std::string& path);

// TF-MG shards in `dir` → dataset directory `out_dir`. Users and items keep
// TF-MG's dense ids; user u's training items are its label-1 rows of cycle 0,
// its positives those plus its true eval item, and its eval list is
// [true item, TF-MG candidates 0 .. L-2] with TF-MG's duplicate mask inverted
// (ours: 1 = counts). opt.eval_negatives, when not 0, must equal the data's E;
// opt.min_interactions does not apply. Every inconsistency is refused with the
// file, the byte offset of the record and the offending feature and value.
DatasetMeta prepare_tfmg(const std::string& dir, const std::string& out_dir, const PrepOptions& opt,
                         TfmgCycles cycles = TfmgCycles::kAll);

}  // namespace ncf
