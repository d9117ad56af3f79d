//! The convolution shapes of ResNet18 the benchmarks time one by one: every distinct
//! convolution of the CIFAR-style model (3x3 stem, 32x32 images: the CPU step's) and of the
//! ImageNet-style one (7x7 stride-2 stem, 224x224: the GPU step's), with how many of the
//! model's twenty convolutions have each shape.

use super::harness::err;
use kiln_device::ops::conv::{Conv2dGeometry, Conv2dParams};

/// One convolution shape of ResNet18.
pub(super) struct ConvCase {
    pub name: &'static str,
    in_channels: usize,
    out_channels: usize,
    size: usize,
    kernel: usize,
    stride: usize,
    /// How many of ResNet18's convolutions have this shape.
    pub uses: usize,
}

impl ConvCase {
    /// The shape's geometry and parameters on a batch of `batch` images.
    pub fn geometry(&self, batch: usize) -> Result<(Conv2dGeometry, Conv2dParams), String> {
        let params = Conv2dParams {
            stride: [self.stride; 2],
            padding: [self.kernel / 2; 2],
            ..Conv2dParams::default()
        };
        let input_shape = [batch, self.in_channels, self.size, self.size];
        let weight_shape = [
            self.out_channels,
            self.in_channels,
            self.kernel,
            self.kernel,
        ];
        let geometry = Conv2dGeometry::new(input_shape, weight_shape, params).map_err(err)?;
        Ok((geometry, params))
    }
}

/// `(name, C_in, C_out, input size, kernel, stride, uses)`.
type Shape = (&'static str, usize, usize, usize, usize, usize, usize);

const fn case((name, in_channels, out_channels, size, kernel, stride, uses): Shape) -> ConvCase {
    ConvCase {
        name,
        in_channels,
        out_channels,
        size,
        kernel,
        stride,
        uses,
    }
}

/// Every distinct convolution of ResNet18 with a 3x3 stride-1 stem on 32x32 images.
pub(super) const RESNET18_CONVS: &[ConvCase] = &[
    case(("conv1_3to64_3x3_32px", 3, 64, 32, 3, 1, 1)),
    case(("layer1_64to64_3x3_32px", 64, 64, 32, 3, 1, 4)),
    case(("layer2.0.conv1_64to128_3x3s2_32px", 64, 128, 32, 3, 2, 1)),
    case(("layer2_128to128_3x3_16px", 128, 128, 16, 3, 1, 3)),
    case((
        "layer2.0.downsample_64to128_1x1s2_32px",
        64,
        128,
        32,
        1,
        2,
        1,
    )),
    case(("layer3.0.conv1_128to256_3x3s2_16px", 128, 256, 16, 3, 2, 1)),
    case(("layer3_256to256_3x3_8px", 256, 256, 8, 3, 1, 3)),
    case((
        "layer3.0.downsample_128to256_1x1s2_16px",
        128,
        256,
        16,
        1,
        2,
        1,
    )),
    case(("layer4.0.conv1_256to512_3x3s2_8px", 256, 512, 8, 3, 2, 1)),
    case(("layer4_512to512_3x3_4px", 512, 512, 4, 3, 1, 3)),
    case((
        "layer4.0.downsample_256to512_1x1s2_8px",
        256,
        512,
        8,
        1,
        2,
        1,
    )),
];

/// Every distinct convolution of ResNet18 with its 7x7 stride-2 stem on 224x224 images.
pub(super) const RESNET18_224_CONVS: &[ConvCase] = &[
    case(("conv1_3to64_7x7s2_224px", 3, 64, 224, 7, 2, 1)),
    case(("layer1_64to64_3x3_56px", 64, 64, 56, 3, 1, 4)),
    case(("layer2.0.conv1_64to128_3x3s2_56px", 64, 128, 56, 3, 2, 1)),
    case(("layer2_128to128_3x3_28px", 128, 128, 28, 3, 1, 3)),
    case((
        "layer2.0.downsample_64to128_1x1s2_56px",
        64,
        128,
        56,
        1,
        2,
        1,
    )),
    case(("layer3.0.conv1_128to256_3x3s2_28px", 128, 256, 28, 3, 2, 1)),
    case(("layer3_256to256_3x3_14px", 256, 256, 14, 3, 1, 3)),
    case((
        "layer3.0.downsample_128to256_1x1s2_28px",
        128,
        256,
        28,
        1,
        2,
        1,
    )),
    case(("layer4.0.conv1_256to512_3x3s2_14px", 256, 512, 14, 3, 2, 1)),
    case(("layer4_512to512_3x3_7px", 512, 512, 7, 3, 1, 3)),
    case((
        "layer4.0.downsample_256to512_1x1s2_14px",
        256,
        512,
        14,
        1,
        2,
        1,
    )),
];
